"""Runs in the AITER peer venv: AITER's own merge of ``AITER_CONFIG_FMOE`` paths, on files a test wrote.

Reads ``{"src": <aiter_src.prepare output>, "bin": …, "cases": [{"id", "paths"}]}`` on stdin; for each case calls
``AITER_CONFIGS.update_config_files(paths, "tuned_fmoe")`` (aiter/jit/core.py, the merge behind
``AITER_CONFIG_FMOE_FILE``) and, when that returns, reads the file it returns as AITER's lookup does
(``pd.read_csv``). Prints ``{"answers": [{"id", "raised", "message", "rows"}]}``: ``raised`` is the exception
class name (None when AITER accepts the configuration), ``rows`` the merged row count.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiter_side  # noqa: E402


def main() -> int:
    job = json.load(sys.stdin)
    src = job["src"]
    sys.path.insert(0, src["root"])
    os.environ["PATH"] = f"{job['bin']}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["AITER_JIT_DIR"] = src["jit_dir"]
    aiter_side._install(src)
    import pandas as pd
    from aiter.jit.core import AITER_CONFIGS

    out = []
    for case in job["cases"]:
        ans = {"id": case["id"], "raised": None, "message": "", "rows": None}
        try:
            merged = AITER_CONFIGS.update_config_files(case["paths"], "tuned_fmoe")
            ans["rows"] = len(pd.read_csv(merged))
        except Exception as exc:  # noqa: BLE001 - AITER raising is the answer
            ans["raised"] = type(exc).__name__
            ans["message"] = str(exc).splitlines()[0][:300] if str(exc) else ""
        out.append(ans)
    json.dump({"answers": out}, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
