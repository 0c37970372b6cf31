"""Building blocks shared by the model families, each ready for tensor-parallel slicing."""
