"""Several processes, one per GPU (or CPU rank): the process group (`group.py`), the sharding
transformation of a built model (`shard.py`) and the workers rank 0 starts and feeds (`launch.py`)."""
