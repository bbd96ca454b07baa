#!/usr/bin/python3
"""External trainers that misbehave on purpose, for tests/integration/external_trainer_test.cc:
  misbehaving.py crash      exits with status 3 when it receives its first task
  misbehaving.py hang       never replies
  misbehaving.py garbage    replies with a line that is not JSON
  misbehaving.py shape      sends a model whose first tensor has the wrong shape
  misbehaving.py refuse     says it cannot train (tessera_client.fail), with a message far
                            longer than a reply line may be
  misbehaving.py nanloss    sends a loss that is not a number; tessera_client refuses it, and
                            the trainer reports the round with tessera_client.fail
  misbehaving.py identity   sends the global model back unchanged (a well-behaved trainer)
"""
import os
import sys
import time

import numpy as np

import tessera_client as tc

mode = sys.argv[1]
while (task := tc.receive()) is not None:
    x, y = task.data()
    print(f"misbehaving trainer ({mode}): round {task.round}, {len(x)} samples", flush=True)
    if mode == "crash":
        sys.exit(3)
    elif mode == "hang":
        time.sleep(3600)
    elif mode == "garbage":
        os.write(4, b"this is not json\n")
    elif mode == "shape":
        arrays = dict(task.arrays)
        first = next(iter(arrays))
        arrays[first] = np.zeros((3, 3), np.float32)
        tc.send(arrays, samples=len(x))
    elif mode == "nanloss":
        try:
            tc.send(task.arrays, samples=len(x), loss=float("nan"))
        except ValueError as e:
            tc.fail(str(e))
    elif mode == "refuse":
        tc.fail("no GPU memory left for this round\n" + "Traceback line\n" * 20000)
    else:
        tc.send(task.arrays, samples=len(x), loss=0.5)
