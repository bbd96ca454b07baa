"""The trainer side of a Tessera worker's external-trainer channel.

A worker started with ``tessera-worker --trainer NAME=COMMAND`` runs COMMAND for jobs whose
``model.trainer`` is NAME. COMMAND receives each round's global model and this worker's share
of the data, trains with any code, and sends the trained model back::

    import tessera_client as tc

    while (task := tc.receive()) is not None:
        model.load_state_dict(task.state_dict())      # torch tensors by state_dict key
        x, y = task.data()                            # this worker's share (numpy arrays)
        ... train for task.epochs with task.batch_size, task.learning_rate ...
        tc.send({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()},
                samples=len(x), loss=mean_loss)

Arrays are named as the job's model names its parameters (PyTorch state_dict keys for
Tessera's built-in models). ``receive()`` returns None when the worker no longer needs this
process; it should then exit. Only NumPy is required; ``Task.state_dict()`` needs torch.

The channel: two pipes the worker passes as file descriptors (TESSERA_TRAINER_FDS=3,4),
one JSON line per request and per reply, arrays in .npz files in a private directory
(see worker/external_trainer.h in the Tessera tree). Print freely: standard output goes to
the worker's log, not to the channel.
"""
import json
import math
import os

import numpy as np

__all__ = ["Task", "receive", "send", "fail"]

_requests = None
_replies = None
_current = None
_data_cache = {}


class Task:
    """One round's work: the global model, the data share and the training settings."""

    def __init__(self, request):
        self.job = request["job"]
        self.round = int(request["round"])
        self.attempt = int(request["attempt"])
        self.party = int(request["party"])
        self.epochs = int(request["epochs"])
        self.batch_size = int(request["batch_size"])
        self.learning_rate = float(request["learning_rate"])
        self.momentum = float(request["momentum"])
        self.weight_decay = float(request["weight_decay"])
        self.seed = int(request["seed"])
        self._model_path = request["model"]
        self._data_path = request["data"]
        self._out_path = request["out"]
        with np.load(self._model_path) as archive:
            self.arrays = {name: archive[name] for name in archive.files}

    def state_dict(self):
        """The global model as torch tensors by name, for ``model.load_state_dict``."""
        import torch

        return {name: torch.from_numpy(array.copy()) for name, array in self.arrays.items()}

    def data(self):
        """(x, y): this worker's share, float32 images N x C x H x W and int64 labels.

        Read once per share: the worker hands a new share (another job or party) over under a
        new file name, so the arrays are kept by that name (a file's modification time need not
        change between two writes). The file's identity is checked as well, for a worker that
        rewrote one name."""
        info = os.stat(self._data_path)
        stamp = (info.st_ino, info.st_size, info.st_mtime_ns)
        cached = _data_cache.get(self._data_path)
        if cached is None or cached[0] != stamp:
            with np.load(self._data_path) as archive:
                cached = (stamp, archive["x"], archive["y"])
            _data_cache.clear()
            _data_cache[self._data_path] = cached
        return cached[1], cached[2]


def _channel():
    global _requests, _replies
    if _requests is None:
        fds = os.environ.get("TESSERA_TRAINER_FDS")
        if not fds:
            raise RuntimeError("tessera_client: not started by a Tessera worker (TESSERA_TRAINER_FDS is not set); "
                               "run this script through tessera-worker --trainer NAME=COMMAND")
        request_fd, reply_fd = (int(fd) for fd in fds.split(","))
        _requests = os.fdopen(request_fd, "r", encoding="utf-8")
        _replies = os.fdopen(reply_fd, "w", encoding="utf-8")
    return _requests, _replies


def receive():
    """Waits for the next round's task; None when the worker is done with this process."""
    global _current
    requests, _ = _channel()
    line = requests.readline()
    if not line:
        _current = None
        return None
    request = json.loads(line)
    if request.get("type") != "train":
        raise RuntimeError("tessera_client: unexpected request type %r" % request.get("type"))
    _current = Task(request)
    return _current


def _reply(message):
    _, replies = _channel()
    replies.write(json.dumps(message, allow_nan=False) + "\n")  # NaN is no JSON the worker reads
    replies.flush()


def send(arrays, samples, loss=None):
    """Sends the trained model back: every array of the global model, same names and shapes.

    ``samples`` is how many of the share's samples the update was trained on (its weight in
    the average); ``loss`` the mean training loss, shown in the round record.
    """
    global _current
    if _current is None:
        raise RuntimeError("tessera_client.send: no task received (call receive() first)")
    if loss is not None:
        loss = float(loss)
        if not math.isfinite(loss):
            raise ValueError("tessera_client.send: loss must be a finite number, got %r (if training diverged, "
                             "tessera_client.fail() reports the round as not trained)" % loss)
    converted = {name: np.ascontiguousarray(np.asarray(value, dtype=np.float32)) for name, value in arrays.items()}
    temporary = _current._out_path + ".tmp.npz"
    np.savez(temporary, **converted)
    os.replace(temporary, _current._out_path)
    message = {"type": "update", "samples": int(samples)}
    if loss is not None:
        message["loss"] = loss
    _current = None
    _reply(message)


# The worker reads a reply line of at most 64 KiB and stops a trainer that sends a longer one, so
# a long message (a traceback) would be lost with the process. It shows the first 512
# characters; 4096 escape to at most 48 KiB of JSON (12 bytes for a character outside the BMP).
_MAX_MESSAGE_CHARS = 4096


def fail(message):
    """Tells the worker this round cannot be trained; it reports the message for the round.

    A message longer than 4096 characters is cut (the worker shows its first 512). Like
    ``send``, it answers the task ``receive`` returned, once: a second answer would be read as
    the next round's, so the worker stops a process that sends one."""
    global _current
    if _current is None:
        raise RuntimeError("tessera_client.fail: no task to answer (call receive() first; send() or fail() "
                           "has answered this one)")
    _current = None
    text = str(message)
    if len(text) > _MAX_MESSAGE_CHARS:
        text = text[:_MAX_MESSAGE_CHARS] + "... (%d characters)" % len(text)
    _reply({"type": "error", "message": text})
