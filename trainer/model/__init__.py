"""The BERT model: `bert` (BertForPreTraining and its layers, FLOP counts), `attention` (the
attention kernels: flash_attn's varlen, jagged NestedTensor SDPA, one call per sequence),
`dropout` (seeded dropout masks), `mlm_loss` (the masked-LM decoder and cross-entropy as one
function), `apex_kernels` (optional apex fused kernels), `weights` (Hugging Face and TensorFlow names),
`fp8` (the encoder's GEMMs in FP8 through torchao.float8, runtime.fp8).

May import: trainer.config, trainer.data
"""
