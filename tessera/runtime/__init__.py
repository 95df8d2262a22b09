"""Loading and launching what the backends produce: the CUDA and HIP drivers, argument packing, tensor
maps, the binary cache and autotuning records. It may import `tessera.ir` and `tessera.version` only.
"""
