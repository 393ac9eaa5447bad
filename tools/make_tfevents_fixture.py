#!/usr/bin/env python3
# TensorBoard event-file fixture for tests/rl/test_tfevents.c: the events below serialized by
# TensorBoard's own protobuf classes and framed by its RecordWriter (needs `pip install
# tensorboard` in a venv). The C test writes the same events and compares bytes.
#   python3 tools/make_tfevents_fixture.py tests/fixtures/rl
import os
import sys

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

LONG_TAG = "long/" + "x" * 200  # a tag whose length needs a two-byte varint

# (wall_time, step, kind, payload) -- mirrored in tests/rl/test_tfevents.c.
EVENTS = [
    (1700000000.25, 0, "version", None),
    (1700000001.5, 0, "scalars", [("reward/mean", 0.0), ("eval/accuracy", 0.375)]),
    (1700000002.75, 7, "scalars", [("loss", -1.25e-3), ("lr", 1e-4), (LONG_TAG, 3.0)]),
    (1700000003.0, 5, "session_start", None),
    (1700000004.0, 300, "scalars", [("time/train", 12.5)]),
]


def event(wall_time, step, kind, payload):
    e = event_pb2.Event(wall_time=wall_time, step=step)
    if kind == "version":
        e.file_version = "brain.Event:2"
    elif kind == "scalars":
        e.summary.CopyFrom(summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in payload]))
    else:
        e.session_log.status = event_pb2.SessionLog.START
    return e.SerializeToString()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/rl"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tfevents.bin"), "wb") as f:
        w = RecordWriter(f)
        for ev in EVENTS:
            w.write(event(*ev))
        w.flush()


if __name__ == "__main__":
    main()
