"""A second GPU: tensors on cuda:1 run on cuda:1 (device guard), eager and captured, and nothing
is allocated on cuda:0. Needs two GPUs (device kind nvidia-h200-x2); skips otherwise."""

import pytest
import torch

from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import make_verify_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs two CUDA GPUs")


def _backends():
    from gpu_cases import cuda_backends

    return cuda_backends()


@pytest.mark.parametrize("backend", _backends() if torch.cuda.is_available() else ["triton"])
def test_second_gpu_eager_and_captured(backend):
    torch.cuda.set_device(0)  # the current device stays cuda:0: the op must follow its tensors
    before = torch.cuda.memory_allocated(0)
    vb = make_verify_batch([3000, 17], [16, 5], 16, device="cuda:1", pad_rows=3, seed=7)
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend=backend)
    assert out.device == torch.device("cuda:1")
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    assert float((out.float() - ref_out.float()).norm() / ref_out.float().norm()) < 2e-2
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))

    with torch.cuda.device(1):
        stream = torch.cuda.Stream()
        out_buf = torch.full_like(out, float("nan"))
        lse_buf = torch.full_like(lse, float("nan"))
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out_buf, lse=lse_buf, backend=backend)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out_buf, lse=lse_buf, backend=backend)
        out_buf.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(1)
    assert float((out_buf.float() - ref_out.float()).norm() / ref_out.float().norm()) < 2e-2
    assert torch.cuda.memory_allocated(0) == before


@pytest.mark.parametrize("kv_dtype", ["same", "fp8"])
def test_second_gpu_paged_and_fp8(kv_dtype):
    """The paged entry point (and an FP8 cache with a kv_scale tensor) on cuda:1: eager and
    captured, against the reference, nothing allocated on cuda:0."""
    from ddtree_op import mla_tree_verify_paged
    from ddtree_op.synthetic_paged import make_paged_batch

    torch.cuda.set_device(0)
    before = torch.cuda.memory_allocated(0)
    pb = make_paged_batch([3000, 17], [16, 5], 16, page_size=64, kv_dtype=kv_dtype, kv_scale_tensor=True, device="cuda:1",
                          pad_rows=3, seed=7)
    ref_out, _ = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), backend="reference")
    out, _ = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs())
    assert out.device == torch.device("cuda:1")
    assert float((out.float() - ref_out.float()).norm() / ref_out.float().norm()) < 2e-2
    with torch.cuda.device(1):
        out_buf = torch.full_like(out, float("nan"))
        lse_buf = torch.full((out.shape[0], 16), float("nan"), device="cuda:1")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), out=out_buf, lse=lse_buf)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), out=out_buf, lse=lse_buf)
        out_buf.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(1)
    assert float((out_buf.float() - ref_out.float()).norm() / ref_out.float().norm()) < 2e-2
    assert torch.cuda.memory_allocated(0) == before
