"""``surrotune worker`` whose replay backend takes DELAY seconds per configuration, so that a test
can kill it with SIGKILL while it holds a RUNNING trial. Test-only: the product replays at full
speed. Usage: python _slow_worker.py DELAY worker EXPERIMENT.toml [options]"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence

from surrotune.backends import replay
from surrotune.cli import main
from surrotune.result import ParamValue, Result

DELAY_S = float(sys.argv[1])
_evaluate = replay.ReplayBackend.evaluate


def _slow(self: replay.ReplayBackend, configs: Sequence[Mapping[str, ParamValue]]) -> list[Result]:
    time.sleep(DELAY_S * len(configs))
    return _evaluate(self, configs)


replay.ReplayBackend.evaluate = _slow  # type: ignore[method-assign]
sys.exit(main(sys.argv[2:]))
