"""Fused Triton kernels for the model's elementwise work (norms, activation, rotary).

Each op has a plain-torch path with the Hugging Face numerics; the Triton path is taken for
CUDA tensors (or anywhere under Triton's interpreter when a caller asks for it explicitly),
so a decode step runs one kernel where torch runs five to ten.
"""
