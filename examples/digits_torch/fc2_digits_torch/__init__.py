"""FC² example bundle: the digits CNN trained with PyTorch's DistributedDataParallel (see main.py)."""
