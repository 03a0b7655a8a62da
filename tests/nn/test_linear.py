"""``robotrl.nn.linear``: oneDNN's products agree with ``F.linear``, forward and backward, and
exported graphs keep the standard op."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn import functional as F

from robotrl.nn import linear as lin
from robotrl.nn.linear import Linear, ensemble_linear, linear

needs_onednn = pytest.mark.skipif(not lin._onednn_works(), reason="no oneDNN in this torch build")


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch):
    """Force ``ROBOTRL_CPU_LINEAR`` to a value for one test (the choice is cached per process)."""

    def set_backend(value: str) -> None:
        monkeypatch.setenv("ROBOTRL_CPU_LINEAR", value)
        lin.onednn_enabled.cache_clear()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the thresholds of one thread (several: see the last test)
    yield set_backend
    torch.set_num_threads(threads)
    monkeypatch.delenv("ROBOTRL_CPU_LINEAR", raising=False)
    lin.onednn_enabled.cache_clear()


def _calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count oneDNN products (forward and backward)."""
    calls: list[int] = []
    real = lin._product

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(lin, "_product", counted)
    return calls


@needs_onednn
@pytest.mark.parametrize("shape", [(512, 64), (16, 32, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_forward_and_gradients_match_f_linear(backend, monkeypatch, shape, bias):
    backend("onednn")
    calls = _calls(monkeypatch)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(96, 64, generator=g, requires_grad=True)
    b = torch.randn(96, generator=g, requires_grad=True) if bias else None
    upstream = torch.randn(*shape[:-1], 96, generator=g)
    ours = linear(x, w, b)
    ours.backward(upstream)
    grads = [t.grad.clone() for t in (x, w, b) if t is not None]
    assert len(calls) == 3  # forward, input gradient, weight gradient
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    ref = F.linear(x, w, b)
    ref.backward(upstream)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-4)
    for mine, theirs in zip(grads, [t.grad for t in (x, w, b) if t is not None], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-3)


@needs_onednn
@pytest.mark.parametrize("shared", [True, False])
def test_onednn_ensemble_matches_baddbmm(backend, monkeypatch, shared):
    backend("onednn")
    calls = _calls(monkeypatch)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*(() if shared else (3,)), 256, 64, generator=g, requires_grad=True)
    w = torch.randn(3, 64, 96, generator=g, requires_grad=True)
    b = torch.randn(3, 1, 96, generator=g, requires_grad=True)
    upstream = torch.randn(3, 256, 96, generator=g)
    ours = ensemble_linear(x, w, b)
    ours.backward(upstream)
    grads = [t.grad.clone() for t in (x, w, b)]
    assert len(calls) == 9  # three members: forward, input and weight gradients
    for t in (x, w, b):
        t.grad = None
    ref = torch.baddbmm(b, x.expand(3, 256, 64) if shared else x, w)
    ref.backward(upstream)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-4)
    for mine, t in zip(grads, (x, w, b), strict=True):
        torch.testing.assert_close(mine, t.grad, rtol=1e-5, atol=1e-3)
    # create_graph (a gradient penalty, a Fisher product) through the ensemble
    hvp = []
    for fn in (ensemble_linear, lambda x, w, b: torch.baddbmm(
            b, x.expand(3, 256, 64) if shared else x, w)):
        (gw,) = torch.autograd.grad(fn(x, w, b).tanh().square().sum(), [w], create_graph=True)
        hvp.append(torch.autograd.grad(gw.sum(), [x])[0])
    torch.testing.assert_close(hvp[0], hvp[1], rtol=1e-4, atol=1e-3)


@needs_onednn
def test_double_backward_through_onednn_layers_matches(backend):
    """TRPO differentiates a gradient (``create_graph``): the backward must be differentiable."""
    backend("onednn")
    torch.manual_seed(0)
    layer = Linear(64, 64)
    x = torch.randn(1024, 64)

    def hvp(fn) -> torch.Tensor:
        out = fn(x, layer.weight, layer.bias).tanh().square().sum()
        (gw,) = torch.autograd.grad(out, [layer.weight], create_graph=True)
        (h,) = torch.autograd.grad(gw.sum(), [layer.weight])
        return h

    torch.testing.assert_close(hvp(linear), hvp(F.linear), rtol=1e-4, atol=1e-3)


@needs_onednn
def test_small_layers_other_dtypes_and_blas_choice_are_f_linear_bit_for_bit(backend, monkeypatch):
    backend("onednn")
    calls = _calls(monkeypatch)
    torch.manual_seed(0)
    small = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)
    assert torch.equal(linear(*small), F.linear(*small))
    double = [t.double() for t in (torch.randn(512, 64), torch.randn(96, 64), torch.randn(96))]
    assert torch.equal(linear(*double), F.linear(*double))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        big = torch.randn(512, 64), torch.randn(96, 64), torch.randn(96)
        assert torch.equal(linear(*big), F.linear(*big))
    assert not calls
    backend("blas")
    assert torch.equal(linear(*big), F.linear(*big))
    assert not calls


@needs_onednn
def test_exported_and_traced_graphs_hold_the_standard_linear(backend):
    backend("onednn")
    layer = Linear(64, 96).eval()
    x = torch.randn(512, 64)
    batch = torch.export.Dim("batch", min=1, max=10**6)  # as sim2real exports: any batch
    program = torch.export.export(layer, (x,), dynamic_shapes=({0: batch},))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert not any("mkldnn" in t for t in targets), targets
    assert any("linear" in t for t in targets), targets
    with warnings.catch_warnings():  # torch 2.14 deprecates torch.jit (a FutureWarning) and
        # TorchScript export still uses it (sim2real/export.py, which says so once when chosen)
        warnings.filterwarnings("ignore", r"`torch\.jit\.\w+` is deprecated", FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        traced = torch.jit.trace(layer, (x,))
    assert "mkldnn" not in str(traced.graph)
    for rows in (3, 512):  # a small batch too: the graph holds no size test
        torch.testing.assert_close(program.module()(x[:rows]), layer(x[:rows]), rtol=1e-5,
                                   atol=1e-4)


@needs_onednn
def test_several_threads_keep_baddbmm_for_ensembles_and_raise_the_size_threshold(backend,
                                                                                  monkeypatch):
    backend("onednn")
    calls = _calls(monkeypatch)
    torch.set_num_threads(2)
    x, w = torch.randn(512, 128), torch.randn(128, 128)  # 8.4M MACs: oneDNN with one thread
    assert torch.equal(linear(x, w), F.linear(x, w))
    ew, eb = torch.randn(2, 128, 128), torch.randn(2, 1, 128)
    assert torch.equal(ensemble_linear(x, ew, eb), torch.baddbmm(eb, x.expand(2, 512, 128), ew))
    assert not calls
    linear(torch.randn(512, 256), torch.randn(256, 256))  # 33.6M MACs
    assert len(calls) == 1


def test_unknown_backend_names_the_allowed_values(backend):
    backend("fast")
    with pytest.raises(ValueError, match="auto, onednn, blas"):
        lin.onednn_enabled()


def test_auto_takes_onednn_only_where_avx512_runs_at_full_width():
    # Zen 5 (family 26) and later: oneDNN's AVX-512 doubles MKL's AVX2 peak; Zen 4 (family 25)
    # splits AVX-512 in two halves, so both reach the same peak and oneDNN's fixed cost loses
    avx512 = {"fma", "avx2", "avx512f"}
    assert lin.full_width_avx512("AuthenticAMD", 26, avx512)
    assert lin.full_width_avx512("AuthenticAMD", 27, avx512)
    assert not lin.full_width_avx512("AuthenticAMD", 25, avx512)
    assert not lin.full_width_avx512("AuthenticAMD", 26, {"fma", "avx2"})
    assert not lin.full_width_avx512("GenuineIntel", 6, avx512)  # MKL takes AVX-512 itself
    assert not lin.full_width_avx512("", -1, set())  # /proc/cpuinfo unreadable


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="the orientation is MKL's")
@pytest.mark.parametrize("shape", [(512, 11, 128), (256, 23, 256), (8, 16, 5, 12)])
@pytest.mark.parametrize("bias", [True, False])
def test_layers_with_few_inputs_orient_the_weight_gradient_and_keep_the_forward(backend, shape,
                                                                                 bias):
    # in <= out / 2: the weight's gradient is (x^T grad)^T, MKL's fast orientation; the
    # forward is F.linear's product bit for bit and every gradient agrees with F.linear's
    backend("blas")
    torch.manual_seed(0)
    *lead, n_in, n_out = shape
    x = torch.randn(*lead, n_in, requires_grad=True)
    w = torch.randn(n_out, n_in, requires_grad=True)
    b = torch.randn(n_out, requires_grad=True) if bias else None
    grad = torch.randn(*lead, n_out)
    ours, ref = linear(x, w, b), F.linear(x, w, b)
    assert torch.equal(ours, ref)
    params = [x, w] + ([b] if bias else [])
    got = torch.autograd.grad(ours, params, grad)
    want = torch.autograd.grad(ref, params, grad)
    for g, r in zip(got, want, strict=True):
        assert g.shape == r.shape
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-4)
    x2, g2 = x.detach().reshape(-1, n_in), grad.reshape(-1, n_out)
    assert torch.equal(got[1], (x2.t() @ g2).t())  # the orientation, not grad^T x
    with torch.no_grad():  # acting: nothing to orient
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    one = x.detach()[(0,) * len(lead[:-1])][:2]  # 2 rows: F.linear itself
    assert torch.equal(linear(one, w, b), F.linear(one, w, b))


@pytest.mark.parametrize("shared", [True, False])
def test_one_output_per_member_matches_baddbmm_and_twice_differentiable(shared):
    """A critic's last layer (``_EnsembleColumn``, one matrix-vector product per member): the
    same values and gradients as ``baddbmm`` in float64, a gradient of a gradient included."""
    g = torch.Generator().manual_seed(2)
    dt = torch.float64
    x = torch.randn(*(() if shared else (3,)), 130, 7, generator=g, dtype=dt, requires_grad=True)
    w = torch.randn(3, 7, 1, generator=g, dtype=dt, requires_grad=True)
    b = torch.randn(3, 1, 1, generator=g, dtype=dt, requires_grad=True)

    def ref(x, w, b):
        return torch.baddbmm(b, x.expand(3, 130, 7) if shared else x, w)

    out = ensemble_linear(x, w, b)
    assert type(out.grad_fn).__name__ == "_EnsembleColumnBackward"
    torch.testing.assert_close(out, ref(x, w, b), rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(ensemble_linear, (x, w, b))
    assert torch.autograd.gradgradcheck(ensemble_linear, (x, w, b))
