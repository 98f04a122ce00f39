"""Kernels chosen by measurement (modeling/kernels.py, packing.py): every path computes F.linear, the
fastest that agrees is used, whatever is chosen the output stays exact, and the table on disk is
trusted only when it is whole and this machine's."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import noisy_copy, tiny_llama
from specviz import DraftModel, GenerationConfig, collect
from specviz import baseline_generate, speculative_generate
from specviz.modeling import kernel_table, kernels, packing
from specviz.modeling.forward import forward, new_cache

ON_X86 = kernels.candidates(torch.float32, 2) != ["linear"]
x86 = pytest.mark.skipif(not ON_X86, reason="oneDNN and MKL's paths are offered on x86 CPUs only")
DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if torch.ops.mkldnn._is_mkldnn_fp16_supported() else [])


@pytest.fixture(autouse=True)
def own_table(tmp_path, monkeypatch):
    """A table of the test's own (SPECVIZ_CACHE), timed quickly: tiny weights, a small flush."""
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECVIZ_PACK", raising=False)
    monkeypatch.setattr(kernels, "FLUSH_BYTES", 1 << 16)
    monkeypatch.setattr(kernels, "REPEATS", 1)
    kernel_table.reset()
    yield
    kernel_table.reset()


@x86
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_path_computes_f_linear_at_every_row_count(dtype):
    g = torch.Generator().manual_seed(0)
    for out, inner, bias in ((96, 32, True), (40, 64, False)):
        w = torch.randn(out, inner, generator=g).to(dtype)
        b = torch.randn(out, generator=g).to(dtype) if bias else None
        for name in kernels.candidates(dtype, 2):
            path = kernels.PATHS[name]
            copy = path.prepare(w) if path.prepare else None
            for rows in (1,) if path.rows else (*kernels.BUCKETS, 4, 7, 40, 100):
                x = torch.randn(rows, inner, generator=g).to(dtype)
                got, want = path.run(x, copy, w, b), F.linear(x, w, b)
                assert got.shape == want.shape and got.dtype == want.dtype, (name, rows)
                assert kernels._agrees(got, want), f"{name} at {rows} rows in {dtype}"


@x86
@pytest.mark.parametrize("name", list(kernels.PATHS))
def test_greedy_speculative_output_is_the_baseline_whatever_path_is_forced(monkeypatch, name):
    """SPECVIZ_PACK=<path> puts every linear of a tiny model on that path (mkl: its one-row multiplies):
    the logits stay the modules' and the speculative text the plain text."""
    target = tiny_llama()
    ids = torch.randint(0, 96, (20,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = forward(target, ids, new_cache(target))
    runs = []
    real = kernels.PATHS[name].run
    monkeypatch.setitem(kernels.PATHS, name, kernels.Path(
        name, kernels.PATHS[name].dtypes, lambda *a: runs.append(a[0].shape[0]) or real(*a),
        kernels.PATHS[name].prepare, kernels.PATHS[name].rows))
    monkeypatch.setenv("SPECVIZ_PACK", name)
    with torch.no_grad():
        got = forward(target, ids, new_cache(target))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    cfg = GenerationConfig(max_new_tokens=24, k=3)
    _, base = collect(baseline_generate(target, [5, 9, 11, 5, 9], cfg))
    assert bool(runs) == (name != "linear"), f"the {name} path was used (linear is F.linear itself)"
    _, spec = collect(speculative_generate(target, DraftModel(noisy_copy(target, 0.05)), [5, 9, 11, 5, 9], cfg))
    assert spec.token_ids == base.token_ids


def test_an_unknown_forced_path_is_refused_with_the_known_ones(monkeypatch):
    monkeypatch.setenv("SPECVIZ_PACK", "fastest")
    with pytest.raises(Exception, match="SPECVIZ_PACK='fastest'.*linear, onednn, packed, mkl"):
        kernels.forced()


@x86
def test_each_row_bucket_takes_the_path_its_plan_chose_padded_where_it_says(monkeypatch):
    monkeypatch.setattr(packing, "MIN_WEIGHT", 1)
    w = torch.randn(48, 32)
    used = []
    for name, p in list(kernels.PATHS.items()):
        monkeypatch.setitem(kernels.PATHS, name, kernels.Path(
            name, p.dtypes, (lambda n, run: lambda x, *a: used.append((n, x.shape[0])) or run(x, *a))(name, p.run),
            p.prepare, p.rows))
    plan = ("mkl", "packed@5", "onednn", "packed", "packed", "linear", "onednn@64", "packed")
    key = kernel_table.entry_key(kernels.shape_of(w), torch.get_num_threads(), 2)
    kernel_table.table().plans[key] = kernels.Plan(plan, {})
    with torch.no_grad():
        for rows in (1, 2, 3, 4, 5, 9, 17, 33, 64, 500):
            used.clear()
            x = torch.randn(rows, 32)
            torch.testing.assert_close(packing.dense(x, w), F.linear(x, w), rtol=1e-4, atol=1e-4)
            name, pad = kernels.parse(plan[kernels.bucket(rows)])
            assert used == [(name, max(pad, rows))], rows


def test_a_larger_bucket_padded_wins_where_it_is_faster_than_the_rows_own():
    """oneDNN's one-row kernel measured slower than its five-row one: one row goes padded to five."""
    n = len(kernels.BUCKETS)
    by_path = {"packed": [3.6, 4.4, 3.1, 2.9, 3.8, 5.9, 10.1, 18.2][:n], "mkl": [3.3] + [None] * (n - 1),
               "linear": [50.0] * n}
    assert [kernels.choose(by_path, i) for i in range(n)] == ["packed@5", "packed@5", "packed@5", "packed",
                                                              "packed", "packed", "packed", "packed"]
    by_path["mkl"][0] = 2.0
    assert kernels.choose(by_path, 0) == "mkl", "a one-row path is never padded, but wins its own bucket"
    assert kernels.choose({"packed": [None] * n}, 0) == "linear"


@x86
def test_the_fastest_path_that_agrees_wins_and_one_that_disagrees_never_does(monkeypatch):
    cost = {"linear": 5, "onednn": 3, "packed": 1, "mkl": 2}

    def timed(path, xs, used, keys, ok, scratch):
        return {k: cost[path.name] * (1 + x.shape[0]) * 1e-6 for k, x in xs.items() if ok[k]}
    monkeypatch.setattr(kernels, "_time", timed)
    p = kernels.PATHS["packed"]
    monkeypatch.setitem(kernels.PATHS, "packed", kernels.Path("packed", p.dtypes, lambda *a: p.run(*a) + 1.0,
                                                              p.prepare))
    probe = packing._Probe(torch.randn(64, 32))
    said = []
    plan, = kernels.measure([probe], kernels.candidates(torch.float32, 2), said.append).values()
    assert plan.paths == ("mkl",) + ("onednn",) * (len(kernels.BUCKETS) - 1)
    assert said == ["64x32 float32: 1 rows mkl, " + ", ".join(f"{b} rows onednn" for b in kernels.BUCKETS[1:])]
    assert all(v is None for v in plan.ms["packed"]), "a path that disagrees is not timed"
    assert set(probe.copies) == {"mkl"}, "the copies of the paths that won are kept, the others dropped"


@x86
def test_weights_that_would_not_fit_twice_are_timed_without_copies(monkeypatch):
    model = tiny_llama()
    linears = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Linear))
    monkeypatch.setattr(packing, "COPY_BUDGET", linears + 100)  # the groups' copies fit, a whole copy does not
    table = packing.pack(model)
    assert table and {k.copies_allowed for k in table.values()} == {0}
    assert kernels.candidates(torch.float32, 0) == ["linear", "onednn"]
    assert kernels.candidates(torch.float32, 1) == ["linear", "onednn", "packed"]


def test_models_whose_grouped_copies_exceed_the_budget_are_not_grouped(monkeypatch):
    monkeypatch.setattr(packing, "COPY_BUDGET", 1000)
    assert packing.pack(tiny_llama()) == {}


def test_a_machine_with_little_memory_does_not_group(monkeypatch):
    model = tiny_llama()
    need = 4 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    monkeypatch.setattr(packing, "_memory", lambda: 2 * need)  # copies would take more than an eighth
    assert packing.pack(model) == {}


@x86
def test_a_weight_changed_inside_a_group_is_used_and_not_its_stale_copies(monkeypatch):
    """q, k and v are one multiply by a concatenated (and packed) copy: changing one of them in place,
    or replacing it, must remake the copies."""
    model = tiny_llama()
    ids = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(3))
    monkeypatch.setenv("SPECVIZ_PACK", "packed")
    with torch.no_grad():
        forward(model, ids, new_cache(model))
        model.model.layers[1].self_attn.k_proj.weight.mul_(-1.0)
        model.model.layers[0].mlp.up_proj.weight = torch.nn.Parameter(torch.randn(128, 64))
        got = forward(model, ids, new_cache(model))
        monkeypatch.setenv("SPECVIZ_PACK", "0")
        fresh = tiny_llama()
        fresh.load_state_dict(model.state_dict())
        want = forward(fresh, ids, new_cache(fresh))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@x86
def test_training_autocast_and_other_dtypes_keep_f_linear(monkeypatch):
    monkeypatch.setenv("SPECVIZ_PACK", "onednn")
    calls = []
    real = kernels.PATHS["onednn"]
    monkeypatch.setitem(kernels.PATHS, "onednn", kernels.Path(
        "onednn", real.dtypes, lambda *a: calls.append(1) or real.run(*a)))
    layer = torch.nn.Linear(8, 24)
    packing.linear(layer, torch.randn(1, 8)).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0 and not calls
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert packing.linear(layer, torch.randn(2, 8)).dtype == torch.bfloat16 and not calls
    with torch.no_grad():
        assert packing.dense(torch.randn(2, 8).double(), layer.weight.double()).dtype == torch.float64 and not calls
        packing.linear(layer, torch.randn(1, 8))
    assert calls == [1]


def test_off_x86_only_f_linear_is_offered():
    assert kernels.candidates(torch.float32, 2, on_x86=False) == ["linear"]


@x86
def test_a_plan_is_timed_once_then_read_from_disk(monkeypatch, capsys):
    w = torch.randn(256, 1024)
    measured = []
    real = kernels.measure
    monkeypatch.setattr(kernels, "measure", lambda *a, **k: measured.append(1) or real(*a, **k))
    monkeypatch.setattr(packing, "MIN_WEIGHT", 1)
    with torch.no_grad():
        packing.dense(torch.randn(3, 1024), w)
    assert measured == [1] and "timing this CPU's kernels for 1 weight shape" in capsys.readouterr().err
    doc = json.loads(kernel_table.table_path().read_text())
    assert doc["machine"] == kernel_table.machine() and len(doc["plans"]) == 1
    kernel_table.reset()
    with torch.no_grad():
        packing.dense(torch.randn(3, 1024), torch.randn(256, 1024))
    assert measured == [1], "the second process reads the table"
    assert "timing" not in capsys.readouterr().err


@pytest.mark.parametrize("damage,why", [
    (lambda text: text[: len(text) // 2], "not JSON"),
    (lambda text: json.dumps(json.loads(text) | {"machine": {"cpu": "another", "torch": "1.0"}}), "another CPU"),
    (lambda text: json.dumps({"machine": json.loads(text)["machine"], "plans": {"1x1 float32 1t": {"paths": ["fast"]}}}),
     "malformed"),
    (lambda text: "[]", "not a kernel table"),
])
def test_a_corrupt_foreign_or_stale_table_is_ignored_with_a_note_and_remade(capsys, damage, why):
    table = kernel_table.table()
    table.plans["8x8 float32 1t"] = kernels.Plan(("linear",) * len(kernels.BUCKETS), {"linear": [1.0] * 8})
    table.save()
    path = kernel_table.table_path()
    path.write_text(damage(path.read_text()))
    kernel_table.reset()
    again = kernel_table.table()
    err = capsys.readouterr().err
    assert why in err and "timing the kernels again" in err and err.count("\n") == 1
    assert again.plans == {}
    w = torch.randn(8, 8)
    again.plans_for([packing._Probe(w)], 1, 0)
    assert json.loads(path.read_text())["machine"] == kernel_table.machine(), "remade whole"


def test_a_cpu_without_fast_bf16_is_never_offered_bf16(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False, raising=False)
    packing._bf16_measured.cache_clear()
    try:
        assert not packing.native_bf16()
        assert packing.draft_dtype(torch.randn(4, 4)) is torch.float32
    finally:
        packing._bf16_measured.cache_clear()


@x86
def test_bf16_that_measures_slower_than_fp32_is_not_fast(monkeypatch):
    """Emulated bf16 (no AVX512-BF16 or AMX) is what a measurement finds slower: then no drafter
    computes in it, whatever the library claims to support."""
    def timing(bf16_ms):
        def measure(items, names, say=None):
            w = items[0].weight
            ms = bf16_ms if w.dtype is torch.bfloat16 else 1.0
            return {kernels.shape_of(w): kernels.Plan(("linear",) * 8, {"linear": [ms] * 8})}
        return measure
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(kernels, "measure", timing(2.0))
    packing._bf16_measured.cache_clear()
    try:
        assert not packing.native_bf16()
        monkeypatch.setattr(kernels, "measure", timing(0.5))
        kernel_table.table_path().unlink()  # what the first measurement saved
        kernel_table.reset()
        packing._bf16_measured.cache_clear()
        assert packing.native_bf16()
    finally:
        packing._bf16_measured.cache_clear()


def test_compile_is_refused_on_a_cpu_with_the_reason_before_anything_loads():
    from specviz import SpecvizError
    from specviz.modeling import models

    with pytest.raises(SpecvizError, match="--compile is for GPUs: on a CPU.*kernels timed fastest"):
        models.load("/no/such/folder", device="cpu", compile=True)


def test_the_page_offers_bf16_as_slower_where_this_cpu_measured_it_slower(monkeypatch):
    from specviz.ui import layout

    monkeypatch.setattr(packing, "native_bf16", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    labels = dict((v, label) for label, v in layout.precision_choices())
    assert "slower" in labels["bfloat16"] and "float16" not in labels
    monkeypatch.setattr(packing, "native_bf16", lambda: True)
    assert dict((v, label) for label, v in layout.precision_choices())["bfloat16"] == "bf16"


def test_a_precision_reaches_the_target_load_and_a_wrong_one_is_one_sentence():
    from specviz import SpecvizError
    from specviz.run.prepare import prepare, run_here
    from specviz.run.settings import Settings
    from specviz.run.arms import parse_arm

    asked = {}

    class Models:
        @staticmethod
        def load(name, progress=None, **kw):
            asked.update(kw)
            raise SpecvizError("stop here")
    with pytest.raises(SpecvizError, match="stop here"):
        s = Settings.from_controls(prompt="x", dtype=" BF16 ")
        run_here(prepare(s, parse_arm("none", s.config()), Models))
    assert asked["dtype"] == "bf16"
    with pytest.raises(SpecvizError, match=r"^precision \(dtype\) must be one of auto, float32, .*got 'int8'$"):
        Settings.from_controls(prompt="x", dtype="int8")


def test_pass_costs_price_a_model_from_the_table_before_it_is_loaded():
    """What the page's precision menu says: each dtype's one- and nine-token pass over the model's shapes,
    from plans timed earlier; a dtype the table lacks a shape of is not priced."""
    from conftest import tiny_llama
    from specviz.modeling import llama_fast

    shapes = llama_fast.pass_shapes(tiny_llama().config)
    assert shapes[:4] == ["128x64", "64x64", "256x64", "64x128"] and shapes[-1] == "96x64" and len(shapes) == 9
    table = kernel_table.table()
    threads = torch.get_num_threads()
    for shape in set(shapes):
        ms = {"packed": [1.0, 1.0, 1.0, 1.0, 2.0, 3.0, 4.0, 5.0]}
        table.plans[kernel_table.entry_key(f"{shape} float32", threads, 2)] = kernels.Plan(("packed",) * 8, ms)
    table.plans[kernel_table.entry_key("96x64 bfloat16", threads, 2)] = kernels.Plan(("packed",) * 8, {"packed": [1.0] * 8})
    assert packing.pass_costs(shapes) == {"float32": (9.0, 18.0)}
