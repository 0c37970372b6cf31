"""Triton kernels for the model's own work outside attention: the fused elementwise ops
(norms, activation, rotary), the greedy token of each logits row, and skinny matmuls for
decode batches.

Each op has a plain-torch (or cuBLAS) path with the Hugging Face numerics; the Triton path is
taken for CUDA tensors (or anywhere under Triton's interpreter when a caller asks for it
explicitly), so a decode step runs one kernel where torch runs several.
"""
