"""`bertctl balance` for 8, 64, 1,024 and 4,096 ranks x 16 sequences, every strategy.

    python benchmarks/balance_table.py [--steps 50] [--seed 0]

Prints one table per scale (what `bertctl balance --ranks N --batch 16 --group 8` prints) and a
last line with the goal: group-local presort + packing at 1,024 ranks <= 1.01 max/mean tokens and
<= 1 % padding while exchanging only inside a node (8 ranks).
"""

import argparse
import time

from trainer.balance.simulate import STRATEGIES, print_table, simulate
from trainer.data.histogram import wikipedia_histogram


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    counts = wikipedia_histogram()[1]
    goal = None
    for ranks in (8, 64, 1024, 4096):
        start = time.perf_counter()
        results = [simulate(s, ranks, 16, 8, args.steps, args.seed, counts) for s in STRATEGIES]
        print_table(results, f"Wikipedia histogram; {time.perf_counter() - start:.1f} s")
        print()
        if ranks == 1024:
            goal = next(r for r in results if r.strategy == "packed")
    met = goal.max_over_mean_tokens <= 1.01 and goal.padding_share <= 0.01
    print(f"goal at 1024 ranks (group-local presort + packing): max/mean tokens {goal.max_over_mean_tokens:.4f}, "
          f"padding {goal.padding_share:.2%}, exchange {goal.exchange_bytes_per_step / 1e3:.0f} KB/step inside a node: "
          f"{'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
