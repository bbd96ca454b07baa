#!/usr/bin/python3
"""Writes the NumPy fixtures of tests/core/data_numpy_test.cc with NumPy itself, and checks
that NumPy reads back written.npz (an archive made by Tessera's encoder, committed beside).
Run from anywhere with Debian's python3-numpy: /usr/bin/python3 make.py"""
import os

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
arrays = dict(weights=np.arange(6, dtype=np.float32).reshape(2, 3),
              labels=np.array([0, 9, 3], np.uint8),
              ids=np.array([-1, 2**40], np.int64),
              f64=np.array([0.5, -1.25]))
np.savez(os.path.join(here, "savez.npz"), **arrays)
np.savez_compressed(os.path.join(here, "savez_compressed.npz"), **arrays)
np.save(os.path.join(here, "int32.npy"), np.array([[1, 2], [3, 4]], dtype=np.int32))

written = os.path.join(here, "written.npz")
if os.path.exists(written):
    with np.load(written) as z:
        assert list(z.keys()) == ["a", "b.c"], list(z.keys())
        assert z["a"].dtype == np.float32 and z["a"].tolist() == [1.0, 2.0]
        assert z["b.c"].shape == (1, 1) and z["b.c"][0, 0] == -3.0
    print("numpy reads written.npz")
