"""Snapshots built in plain Python, in the schema torch/cuda/memory.py documents, for the
rules' examples, the tests and the benchmark (a real snapshot needs a CUDA device).

:class:`SnapshotBuilder` plays a small caching allocator: requests are rounded to 512
bytes, served best-fit from free blocks of cached segments (splitting them) or from a new
segment (a ``segment_alloc``), frees merge neighbouring free blocks, ``empty_cache``
returns wholly free segments. It writes what ``_dump_snapshot`` writes: ``segments`` with
their blocks and ``device_traces`` with every action, and for the new generation
``allocator_settings``, ``external_annotations`` and ``time_us``.

It writes them as torch does, which real snapshots (six from other projects, torch 2.1 to
2.7, read for this) show: an ``alloc`` or ``free_*`` entry carries the size the caller
asked for, not the block's (a block's ``requested_size``); every distinct frame is one
dict shared by every stack that holds it, and a free's ``free_requested`` and
``free_completed`` share one frames list, so pickling them is mostly memo gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MIB = 1 << 20
_ROUND = 512
_SEGMENT_ROUND = 2 * MIB

RawFrames = list[dict[str, Any]]

TORCH = "/usr/lib/python3/site-packages/torch"


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def forward_frames(line: int, name: str = "forward", file: str = "/job/model.py") -> RawFrames:
    """An allocation inside a module's forward, innermost first (torch functional, then
    the user's line, then Module._call_impl)."""
    return [
        frame("??", 0, "??"),
        frame(f"{TORCH}/nn/functional.py", 2100, "linear"),
        frame(file, line, name),
        frame(f"{TORCH}/nn/modules/module.py", 1750, "_call_impl"),
        frame("/job/train.py", 40, "train_step"),
    ]


def param_frames(line: int = 12) -> RawFrames:
    return [
        frame(f"{TORCH}/nn/modules/module.py", 1160, "convert"),
        frame(f"{TORCH}/nn/modules/module.py", 900, "_apply"),
        frame(f"{TORCH}/nn/modules/module.py", 1174, "to"),
        frame("/job/train.py", line, "main"),
    ]


def optimizer_state_frames(line: int = 44) -> RawFrames:
    return [
        frame(f"{TORCH}/optim/adam.py", 160, "_init_group"),
        frame(f"{TORCH}/optim/adam.py", 220, "step"),
        frame("/job/train.py", line, "train_step"),
    ]


def optimizer_temp_frames(line: int = 44) -> RawFrames:
    return [
        frame(f"{TORCH}/optim/adam.py", 520, "_multi_tensor_adam"),
        frame(f"{TORCH}/optim/adam.py", 220, "step"),
        frame("/job/train.py", line, "train_step"),
    ]


def user_frames(line: int, name: str = "train_step", file: str = "/job/train.py") -> RawFrames:
    return [frame(f"{TORCH}/_tensor.py", 50, "__torch_function__"), frame(file, line, name)]


@dataclass
class _Block:
    address: int
    size: int
    requested: int = 0
    state: str = "inactive"
    frames: RawFrames = field(default_factory=list)


@dataclass
class _Segment:
    address: int
    size: int
    blocks: list[_Block]


class SnapshotBuilder:
    def __init__(self, *, new_schema: bool = True, expandable_segments: bool = False):
        self._frames: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.new_schema = new_schema
        self.expandable = expandable_segments
        self.segments: list[_Segment] = []
        self.entries: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []
        self.time_us = 1_700_000_000_000_000
        self._next_address = 0x7F0000000000
        self._live: dict[int, _Block] = {}

    # -- actions --------------------------------------------------------------------
    def _shared(self, frames: RawFrames) -> RawFrames:
        """``frames`` as a new list of the one shared dict per distinct frame."""
        out = []
        for f in frames:
            key = (f.get("filename"), f.get("line"), f.get("name"))
            out.append(self._frames.setdefault(key, f))
        return out

    def _entry(self, action: str, addr: int | None, size: int, frames: RawFrames, **extra):
        entry: dict[str, Any] = {"action": action, "size": size, "stream": 0, "frames": frames}
        if addr is not None:
            entry["addr"] = addr
        if self.new_schema:
            entry["time_us"] = self.time_us
            entry["compile_context"] = ""
            entry["user_metadata"] = ""
        entry.update(extra)
        self.entries.append(entry)
        self.time_us += 1000

    def tick(self, us: int) -> None:
        self.time_us += us

    def annotate(self, name: str, stage: str) -> None:
        self.annotations.append(
            {"device": 0, "stage": stage, "name": name, "time_us": self.time_us}
        )

    def alloc(self, size: int, frames: RawFrames) -> int:
        """Allocates ``size`` bytes; returns the block's address (its handle)."""
        frames = self._shared(frames)
        rounded = max(_ROUND, -(-size // _ROUND) * _ROUND)
        best = None
        for seg in self.segments:
            for block in seg.blocks:
                fits = block.state == "inactive" and block.size >= rounded
                if fits and (best is None or block.size < best[1].size):
                    best = (seg, block)
        if best is None:
            seg_size = -(-rounded // _SEGMENT_ROUND) * _SEGMENT_ROUND
            seg = _Segment(self._next_address, seg_size, [_Block(self._next_address, seg_size)])
            self._next_address += seg_size + _SEGMENT_ROUND
            self.segments.append(seg)
            self._entry("segment_alloc", seg.address, seg_size, frames)
            best = (seg, seg.blocks[0])
        seg, block = best
        if block.size > rounded:
            rest = _Block(block.address + rounded, block.size - rounded)
            seg.blocks.insert(seg.blocks.index(block) + 1, rest)
            block.size = rounded
        block.state, block.requested, block.frames = "active_allocated", size, frames
        self._live[block.address] = block
        self._entry("alloc", block.address, size, frames)
        return block.address

    def free(self, address: int, *, frames: RawFrames | None = None, pending=False) -> None:
        """Frees the block at ``address``; ``pending``: only free_requested (another
        stream still uses it), the block stays active_pending_free."""
        block = self._live[address]
        frames = self._shared(frames or [])
        self._entry("free_requested", address, block.requested, frames)
        if pending:
            block.state = "active_pending_free"
            return
        del self._live[address]
        self._entry("free_completed", address, block.requested, frames)
        block.state, block.frames, block.requested = "inactive", [], 0
        for seg in self.segments:
            if block in seg.blocks:
                merged: list[_Block] = []
                for b in seg.blocks:
                    if merged and merged[-1].state == b.state == "inactive":
                        merged[-1].size += b.size
                    else:
                        merged.append(b)
                seg.blocks = merged

    def empty_cache(self) -> None:
        for seg in list(self.segments):
            if all(b.state == "inactive" for b in seg.blocks):
                self._entry("segment_free", seg.address, seg.size, [])
                self.segments.remove(seg)

    def oom(self, size: int, device_free: int) -> None:
        self._entry("oom", None, size, [], device_free=device_free)

    # -- the snapshot ---------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        segments = []
        for seg in self.segments:
            blocks = []
            for b in seg.blocks:
                block = {"address": b.address, "size": b.size, "state": b.state}
                block["requested_size"] = b.requested if b.state != "inactive" else 0
                block["frames"] = b.frames
                blocks.append(block)
            allocated = sum(b.size for b in seg.blocks if b.state == "active_allocated")
            active = sum(b.size for b in seg.blocks if b.state != "inactive")
            segments.append(
                {
                    "device": 0,
                    "address": seg.address,
                    "total_size": seg.size,
                    "stream": 0,
                    "segment_type": "large" if seg.size > MIB else "small",
                    "segment_pool_id": (0, 0),
                    "allocated_size": allocated,
                    "active_size": active,
                    "requested_size": sum(b.requested for b in seg.blocks),
                    "is_expandable": self.expandable,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        out: dict[str, Any] = {"segments": segments, "device_traces": [list(self.entries)]}
        if self.new_schema:
            out["allocator_settings"] = {
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if self.expandable else "",
                "max_split_size": -1,
                "garbage_collection_threshold": 0.0,
                "expandable_segments": self.expandable,
                "pinned_num_register_threads": 1,
                "release_lock_on_malloc": False,
                "pinned_use_host_register": False,
                "roundup_power2_divisions": {},
            }
            out["external_annotations"] = list(self.annotations)
        return out


def training_snapshot(
    *,
    param_bytes: int = 64 * MIB,
    activation_bytes: int = 32 * MIB,
    layers: int = 4,
    adam: bool = True,
    steps: int = 2,
    new_schema: bool = True,
    leak_bytes_per_step: int = 0,
) -> dict[str, Any]:
    """A small training job: parameters moved to the GPU, then ``steps`` of forward
    (``layers`` activations saved, each with a temporary), backward (gradients, unframed
    as with stacks="python"), and Adam (two state tensors per parameter on the first
    step). ``leak_bytes_per_step``: a tensor kept each step at /job/train.py:52."""
    b = SnapshotBuilder(new_schema=new_schema)
    params = [b.alloc(param_bytes // layers, param_frames()) for _ in range(layers)]
    grads: list[int] = []
    state: list[int] = []
    for _ in range(steps):
        b.annotate("forward", "START")
        saved = []
        for layer in range(layers):
            tmp = b.alloc(activation_bytes // layers, forward_frames(60 + layer, "mlp"))
            saved.append(b.alloc(activation_bytes // layers, forward_frames(30 + layer)))
            b.free(tmp, frames=forward_frames(61 + layer, "mlp"))
        if leak_bytes_per_step:
            b.alloc(leak_bytes_per_step, user_frames(52))
        b.annotate("forward", "END")
        for act in reversed(saved):
            if not grads or len(grads) < layers:
                grads.append(b.alloc(param_bytes // layers, []))
            b.free(act)
        if adam:
            if not state:
                for _ in range(2 * layers):
                    state.append(b.alloc(param_bytes // layers, optimizer_state_frames()))
            tmp = b.alloc(param_bytes // layers, optimizer_temp_frames())
            b.free(tmp, frames=optimizer_temp_frames())
    del params
    return b.snapshot()


def fragmented_snapshot(
    *, tensors: int = 100, tensor_bytes: int = 8 * MIB, oom_bytes: int | None = None, **kw
) -> dict[str, Any]:
    """One segment of ``tensors`` equal tensors with every other one freed: half the
    segment cached in holes no larger than one tensor; ``oom_bytes``: then a request of
    that size fails (CUDA reporting 1 MiB free)."""
    b = SnapshotBuilder(**kw)
    whole = b.alloc(tensors * tensor_bytes, user_frames(20, "load_batch"))
    b.free(whole, frames=user_frames(21, "load_batch"))
    handles = [b.alloc(tensor_bytes, forward_frames(70 + i % 8)) for i in range(tensors)]
    for handle in handles[::2]:
        b.free(handle, frames=forward_frames(90))
    if oom_bytes is not None:
        b.oom(oom_bytes, device_free=MIB)
    return b.snapshot()


def site_oom_snapshot() -> dict[str, Any]:
    """Out of memory with no fragmentation: one line's 40 tensors of 16 MiB fill their
    segments, and a 64 MiB request fails."""
    b = SnapshotBuilder()
    b.alloc(64 * MIB, param_frames())
    for _ in range(40):
        b.alloc(16 * MIB, user_frames(88, "cache_outputs"))
    b.oom(64 * MIB, device_free=10 * MIB)
    return b.snapshot()


def spread_oom_snapshot() -> dict[str, Any]:
    """Out of memory with ten lines each holding one 4 MiB tensor (10 % each) in their own
    segments, no free piece: a 12 MiB request fails."""
    b = SnapshotBuilder()
    for i in range(10):
        b.alloc(2 * MIB, user_frames(100 + i, "prepare"))
        b.alloc(2 * MIB, user_frames(100 + i, "prepare"))
    b.oom(12 * MIB, device_free=MIB)
    return b.snapshot()


def _allocator_frames() -> RawFrames:
    """The C++ frames stacks="all" puts under every allocation, innermost first."""
    return [
        frame("??", 0, "torch::unwind::unwind()"),
        frame("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
        frame("memory_snapshot.cpp", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
        frame(
            "CUDACachingAllocator.cpp",
            0,
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed "
            "char, unsigned long, CUstream_st*)",
        ),
        frame("", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate"),
        frame("??", 0, "at::detail::empty_generic"),
        frame("??", 0, "at::detail::empty_cuda"),
        frame("RegisterCUDA.cpp", 0, "at::(anonymous namespace)::create_out"),
    ]


def deep_stack_snapshot(*, steps: int = 50, layers: int = 100, depth: int = 31) -> dict[str, Any]:
    """A long training job recorded with stacks="all", built as torch builds it: each
    allocation's stack is ``depth`` frames (the allocator's C++ frames, the dispatcher's,
    the layer's Python line, the module machinery, the loop), drawn from a few hundred
    distinct frame dicts that every stack shares. ``steps`` x ``layers`` x 6 entries
    (50 x 100: 30,000); pickled, about three quarters of its opcodes are memo gets."""
    b = SnapshotBuilder()
    cpp = _allocator_frames()
    dispatch = [frame("??", 0, f"at::_ops::op_{i}::call") for i in range(depth - len(cpp) - 6)]

    def stack(layer: int, line: int, name: str) -> RawFrames:
        python = [
            frame(f"{TORCH}/nn/functional.py", 2100 + line % 3, "linear"),
            frame("/job/model.py", 100 + layer, name),
            frame(f"{TORCH}/nn/modules/module.py", 1750, "_call_impl"),
            frame(f"{TORCH}/nn/modules/module.py", 1739, "_wrapped_call_impl"),
            frame("/job/train.py", 40, "train_step"),
            frame("/job/train.py", 80, "<module>"),
        ]
        return cpp + dispatch + python

    weights = [b.alloc(MIB, stack(layer, 0, "__init__")) for layer in range(layers)]
    grads: list[int] = []
    for _ in range(steps):
        saved = []
        for layer in range(layers):
            tmp = b.alloc(64 * 1024 + 4, stack(layer, 1, "mlp"))
            saved.append(b.alloc(256 * 1024 + 8, stack(layer, 2, "forward")))
            b.free(tmp, frames=stack(layer, 1, "mlp"))
        for layer, act in zip(reversed(range(layers)), reversed(saved), strict=True):
            if len(grads) < layers:
                grads.append(b.alloc(MIB, stack(layer, 3, "backward")))
            b.free(act, frames=stack(layer, 2, "forward"))
    del weights
    return b.snapshot()
