"""zrt checkpoints from Python: read any tensor of a checkpoint saved by any number of ranks, write one
that zrt loads at any world size, verify, plan (docs/python.md).

    import zrt
    ck = zrt.open("run/ckpt")                 # a checkpoint directory, or a root: its newest complete one
    ck.tensors                                # names, in registration order
    w = ck.read("h.0.attn.c_attn.weight")     # numpy float32, the tensor's shape (fp32 master weights)
    m = ck.read("wte", "exp_avg", 0, 10)      # rows 0..9 of its Adam first moment
    sd = ck.state_dict()                      # name -> array: torch.from_numpy(...) into load_state_dict
    zrt.write("out", {k: v.numpy() for k, v in model.state_dict().items()}, world_size=4)
"""
import json as _json

from ._zrt import Error, PlanInput, plan_json as _plan_json, verify as _verify, write as _write
from ._zrt import Checkpoint as _Checkpoint

__all__ = ["Error", "Checkpoint", "open", "write", "verify", "plan"]


class Checkpoint:
    """A complete checkpoint, read lazily: only the chunks a read overlaps are read (each checked)."""

    def __init__(self, path):
        self._c = _Checkpoint(str(path))
        self.dir = self._c.dir
        self.step = self._c.step
        self.world_size = self._c.world_size
        self.stage = self._c.stage
        self.loss_scale = self._c.loss_scale
        self.groups = self._c.groups
        self.trainer_state = _json.loads(self._c.trainer_state_json)
        self.engine_state = _json.loads(self._c.engine_state_json)

    @property
    def tensors(self):
        return [t["name"] for g in self.groups for t in g["tensors"]]

    @property
    def kinds(self):
        """The state kinds saved: "master" (fp32 weights), "exp_avg", "exp_avg_sq"[, "max_exp_avg_sq"]."""
        out = []
        for g in self.groups:
            out += [k for k in g["kinds"] if k not in out]
        return out

    def info(self, name):
        for g in self.groups:
            for t in g["tensors"]:
                if t["name"] == name:
                    return dict(t, group=g["name"], lr=g["lr"], weight_decay=g["weight_decay"], kinds=g["kinds"])
        raise KeyError(name)

    def read(self, name, kind="master", start=None, stop=None):
        """Tensor `name`'s `kind` as float32 in its shape; rows [start, stop) of the first dimension."""
        return self._c.read(name, kind, start, stop)

    def state_dict(self, kind="master"):
        return {n: self.read(n, kind) for n in self.tensors}

    def __repr__(self):
        return f"zrt.Checkpoint({self.dir!r}, step {self.step}, {len(self.tensors)} tensors, saved by {self.world_size} ranks at stage {self.stage})"


def open(path):  # noqa: A001 (the module's verb, as h5py.File / safetensors.safe_open)
    return Checkpoint(path)


def write(root, params, world_size=1, stage=3, optimizer=None, step=0, trainer_state=None, groups=None, dtypes=None,
          model_dtype="f32", lr=0.0, weight_decay=0.0):
    """A complete checkpoint under `root` for `world_size` ranks from numpy arrays (anything that casts to
    float32; torch tensors via .numpy()). `optimizer`: {kind: {name: array}} for every tensor (zrt resumes
    from it), or None (parameters only: load with LoadOptions::params_only). `groups`: name -> group
    ("default"); `dtypes`: name -> the model's dtype ("bf16", "f16", "f32"; default `model_dtype`).
    Returns the checkpoint's directory."""
    return _write(str(root), dict(params), world_size, stage, dict(optimizer or {}), step,
                  _json.dumps(trainer_state or {}), dict(groups or {}), dict(dtypes or {}), model_dtype, lr, weight_decay)


def verify(path):
    """(ok, problems): every rule of the format and every chunk's checksum."""
    return _verify(str(path))


def plan(**kwargs):
    """zrt plan as a dict: the keyword arguments are PlanInput's fields (params, layers, hidden, heads, vocab,
    seq, batch, gpus, stage, offload, param_bytes, gpu_mem_gib, step_seconds, tokens, tflops, power_watts; the
    failure model: mttf_hours, mtbf_hours, node_loss, tier_miss, relaunch, the *_gbps rates, from_bench, and
    the given seconds save_stall, disk_write, replica_write, restart_disk, restart_memory, restart_replica)."""
    p = PlanInput()
    for k, v in kwargs.items():
        if not hasattr(p, k):
            raise TypeError(f"plan: unknown argument {k!r}")
        setattr(p, k, v)
    return _json.loads(_plan_json(p))
