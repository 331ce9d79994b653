"""Data preparation: raw text or MLPerf TFRecords -> the HDF5 training set, torch-free.

The pipeline, for one dataset manifest (`trainer.config.DatasetManifest`), in four stages whose tasks
are independent files (so they run in parallel locally or as Slurm array tasks, and an interrupted
run restarts where it stopped):

  corpus    the text of the python_stdlib corpus (stdlib_corpus.py, sentences.py, textfile.py) and a
            WordPiece vocabulary trained on it (vocab.py); nothing for other sources
  examples  one task per input part: text -> documents -> next-sentence pairs (instances.py) ->
            masking (masking.py), or TFRecord -> samples (tfrecord.py); written to <root>/.work
  combine   one task per group of output shards: the 4-bin split into balanced shards (bins.py),
            or the even eval pick (eval_pick.py)
  checkpoint  the phase-1 TensorFlow checkpoint -> PyTorch (trainer/checkpoints/convert.py), when the
            manifest names one
  finish    per-file statistics and content digests (stats.py) -> <root>/prepared.json

`python -m trainer.data.prepare` is the worker's command line (see __main__.py), which also runs
each step alone on plain files; `verify.py` checks a prepared dataset. Every file is written under a
temporary name and renamed when complete (files.py). Nothing here imports torch except the
checkpoint stage.
"""
