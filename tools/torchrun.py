"""torchrun with the start-up fix Debian bookworm's torch 1.13 needs on Python 3.11.

torch.distributed.elastic's to_map() receives None for the default "no
redirect" setting there (Std.from_str changed with Python 3.11's enum) and
fails before any worker starts. This wrapper maps None to Std.NONE and then
runs torchrun unchanged, with the same arguments:

    /usr/bin/python3 tools/torchrun.py --nproc_per_node 2 --no_python shoal train ...
"""
import sys

import torch.distributed.elastic.multiprocessing as mp
import torch.distributed.elastic.multiprocessing.api as api

_to_map = api.to_map


def _to_map_none_is_no_redirect(val_or_map, local_world_size):
    return _to_map(api.Std.NONE if val_or_map is None else val_or_map, local_world_size)


api.to_map = _to_map_none_is_no_redirect
mp.to_map = _to_map_none_is_no_redirect

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
