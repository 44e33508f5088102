"""Sites and phases on stacks as stacks="all" records them: C++ frames (allocator, autograd
engine, AccumulateGrad), unsymbolised ``??`` frames and Python frames interleaved, innermost
first. The C++ names are PyTorch's own, as the installed torch 2.13 headers declare them
(torch/include/c10/cuda/CUDACachingAllocator.h: namespace c10::cuda::CUDACachingAllocator;
torch/csrc/autograd/functions/accumulate_grad.h: AccumulateGrad::accumulateGrad;
torch/csrc/autograd/engine.h: Engine::thread_main), demangled as the symbolizer writes them;
the allocator's inner class name (Native::DeviceCachingAllocator, in the .cpp) is from
memory, and only its namespace prefix matters here."""

from __future__ import annotations

from diagnostics.snapshot.schema import Frame
from diagnostics.snapshot.sites import category_of, phase_of, site_of

TORCH = "/opt/conda/lib/python3.11/site-packages/torch"
ALLOC = Frame(
    "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
    1402,
    "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
)
EVAL = Frame("??", 0, "_PyEval_EvalFrameDefault")


def test_the_site_is_the_first_python_frame_outside_torch():
    stack = (
        ALLOC,
        Frame(
            "/pytorch/aten/src/ATen/native/cuda/Blas.cpp", 300, "at::native::addmm_out_cuda_impl"
        ),
        EVAL,
        Frame(f"{TORCH}/nn/modules/linear.py", 125, "forward"),
        EVAL,
        Frame("/home/alice/llm/model.py", 88, "forward"),
        Frame(f"{TORCH}/nn/modules/module.py", 1762, "_call_impl"),
        Frame("/home/alice/llm/train.py", 140, "train_step"),
    )
    site = site_of(stack)
    assert (site.key, site.label, site.user_code) == (
        "/home/alice/llm/model.py:88 in forward",
        "model.py:88 in forward",
        True,
    )
    # the stack shown is the Python frames, innermost first
    assert site.stack_text.splitlines()[0] == f"{TORCH}/nn/modules/linear.py:125 in forward"
    assert phase_of(stack) == "forward"


def test_accumulate_grad_in_cpp_frames_is_a_gradient():
    stack = (
        ALLOC,
        Frame(
            "/pytorch/torch/csrc/autograd/functions/accumulate_grad.h",
            200,
            "torch::autograd::AccumulateGrad::accumulateGrad<...>",
        ),
        Frame(
            "/pytorch/torch/csrc/autograd/engine.cpp",
            1100,
            "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
        ),
    )
    assert phase_of(stack) == "backward"
    assert category_of(stack, "backward", outlived_phase=False) == "gradients"
    site = site_of(stack)
    assert not site.user_code  # no Python frame at all: the innermost named one is kept
    assert site.label.startswith("CUDACachingAllocator.cpp:1402 in c10::cuda::")


def test_a_stack_of_unsymbolised_frames_only():
    site = site_of((EVAL, Frame("??", 0, "??")))
    assert site.key == "(unsymbolised frames)" and not site.user_code


def test_optimizer_state_and_init():
    state = (
        Frame(f"{TORCH}/optim/adamw.py", 150, "_init_group"),
        Frame(f"{TORCH}/optim/adamw.py", 209, "step"),
        Frame("/home/alice/llm/train.py", 150, "train_step"),
    )
    assert phase_of(state) == "optimizer"
    assert category_of(state, "optimizer", outlived_phase=None) == "optimizer_state"
    moved = (
        Frame(f"{TORCH}/nn/modules/module.py", 1341, "convert"),
        Frame(f"{TORCH}/nn/modules/module.py", 928, "_apply"),
        Frame(f"{TORCH}/nn/modules/module.py", 1355, "to"),
        Frame("/home/alice/llm/train.py", 60, "main"),
    )
    assert category_of(moved, phase_of(moved), outlived_phase=None) == "parameters"
    # a user line with no module, optimizer or autograd frame: its category is not guessed
    plain = (Frame("/home/alice/llm/train.py", 170, "log_metrics"),)
    assert category_of(plain, phase_of(plain), outlived_phase=True) == "unknown"


def _engine_thread_stack(node: str | None) -> tuple[Frame, ...]:
    """A C++-only stack as a real snapshot (torch 2.3, stacks="all") records an allocation
    on autograd's engine thread: capture, allocator, dispatcher, then the backward node."""
    frames = [
        Frame("??", 0, "torch::unwind::unwind()"),
        Frame("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
        Frame("memory_snapshot.cpp", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
        Frame("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::malloc"),
        Frame("RegisterCUDA.cpp", 0, "at::(anonymous namespace)::create_out(c10::ArrayRef<long>)"),
        Frame("??", 0, "at::_ops::nll_loss_backward::call(at::Tensor const&, long)"),
    ]
    if node:
        frames.append(Frame("??", 0, f"torch::autograd::generated::{node}::apply(std::vector)"))
    frames += [
        Frame("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<ReadyQueue>)"),
        Frame("thread.cc", 0, "execute_native_thread_routine"),
    ]
    return tuple(frames)


def test_a_cpp_only_stack_is_named_by_its_backward_node_then_its_op():
    site = site_of(_engine_thread_stack("NllLossBackward0"))
    assert site.label == "NllLossBackward0 (autograd backward)"
    assert site.user_code is False
    assert "gather_with_cpp" in site.stack_text  # the frames are still shown
    assert site_of(_engine_thread_stack(None)).label == "aten::nll_loss_backward"
