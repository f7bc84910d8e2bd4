"""Run the crash-state job in a process of its own, recording its file-system calls.

    python -m crash_states.record_child setup ROOT DB_TYPE SHAPE
    python -m crash_states.record_child record ROOT DB_TYPE SHAPE OUT

``setup`` commits epochs 0 and 1; ``record`` reruns the job to epoch 2 (a resume from
1, a save and its commit) under :class:`~crash_states.recorder.FsRecorder` (ROOT a
local directory) or :func:`~crash_states.s3_requests.recording_requests` (ROOT an
``s3://`` URL; the ``AWS_*`` variables name the server) and pickles the recording to
OUT. A process of its own, so that the writer it leaves in the lease
is a process that is gone, as after a real crash.
"""

from __future__ import annotations

import contextlib
import pickle
import sys

from crash_states.recorder import FsRecorder
from crash_states.s3_requests import recording_requests
from crash_states.scenario import SHAPES, run_job


def main() -> None:
    mode, root, db_type, shape_name = sys.argv[1:5]
    shape = SHAPES[shape_name]
    if mode == "setup":
        run_job(root, db_type, shape, 1)
        return
    if root.startswith("s3://"):
        with recording_requests() as requests:
            run_job(root, db_type, shape, 2)
        with open(sys.argv[5], "wb") as out:
            pickle.dump(requests, out)
        return
    recorder = FsRecorder(root)
    with contextlib.ExitStack() as stack:
        if db_type == "lmdb":
            stack.enter_context(recorder.watch_lmdb())
        stack.enter_context(recorder.recording())
        run_job(root, db_type, shape, 2)
    with open(sys.argv[5], "wb") as out:
        pickle.dump(recorder.result, out)


if __name__ == "__main__":
    main()
