"""GPU kernel and mixed-pass times against the kernel tables and the roofline
(`koi.predictor.kernel_evidence`, `koi bench kernels`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from koi.cli.main import app
from koi.predictor import tables
from koi.predictor.kernel_evidence import KernelsFileError, compare_kernels

H200 = tables.load_system("h200_sxm")
MODEL = ("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336)   # id, layers, hidden, heads, kv, d, ffn


def table_ms(dtype: str, m: int, n: int, k: int) -> float:
    a = H200.arrays
    at = [int(np.nonzero(a[f"gemm_{x}"] == v)[0][0]) for x, v in (("m", m), ("n", n), ("k", k))]
    return float(a["gemm"][[str(d) for d in a["gemm_dtypes"]].index(dtype), *at])


def mixed_row(layer_s: float | None, batch: int, chunk: int, past: int = 0) -> dict:
    name, layers, hidden, heads, kv, d, ffn = MODEL
    return {"model": name, "tp": 1, "layers": layers, "hidden": hidden, "heads": heads,
            "kv_heads": kv, "head_dim": d, "ffn": ffn, "batch": batch, "ctx": 2048,
            "chunk": chunk, "past": past, "layer_s": layer_s}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "kernels.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_a_gemm_cell_is_set_against_the_tables_own_cell(tmp_path: Path) -> None:
    cell = table_ms("bfloat16", 64, 6144, 4096) * 1e-3
    runs = [{"env": {"device": "NVIDIA H200"},
             "gemm": [{"dtype": "bfloat16", "m": 64, "n": 6144, "k": 4096, "s": cell * f},
                      # n and k swapped: a different cell of the table
                      {"dtype": "bfloat16", "m": 64, "n": 4096, "k": 6144, "s": cell},
                      {"dtype": "bfloat16", "m": 3, "n": 6144, "k": 4096, "s": cell}]}
            for f in (0.5, 0.4, 0.45)]
    c = compare_kernels(write(tmp_path, {"runs": runs}))
    assert c.off_grid == 1   # m = 3 is not a measured m (a point, whatever its runs)
    on, swapped = (r for r in c.cells if r.shape.startswith("m=64"))
    assert on.shape == "m=64 n=4096 k=6144" and swapped.shape == "m=64 n=6144 k=4096"
    assert swapped.runs == 3 and swapped.measured_s == pytest.approx(cell * 0.45)
    assert swapped.ratio == pytest.approx(1 / 0.45)
    assert swapped.run_spread == pytest.approx(0.1 / 0.45)
    assert on.ratio == pytest.approx(table_ms("bfloat16", 64, 4096, 6144) * 1e-3 / cell)


def test_a_decode_pass_is_the_tables_gemms_and_decode_attention_per_layer(
        tmp_path: Path) -> None:
    rows = [mixed_row(3e-4, 16, 0), mixed_row(5e-4, 0, 512), mixed_row(6e-4, 16, 512)]
    c = compare_kernels(write(tmp_path, {"env": {}, "mixed": rows}))
    dec, chunk, both = sorted(c.mixed, key=lambda r: (r.chunk, r.batch))
    assert (dec.group, chunk.group, both.group) == ("decode only", "chunk only",
                                                    "decode + chunk")
    # by hand from the raw table: the layer's four GEMMs at 16 tokens (on-grid n, k only
    # interpolate between the table's n columns) plus decode attention of 16 × 2049 tokens
    _, layers, hidden, heads, kv, d, ffn = MODEL
    gemm = sum(tables.gemm_curve(H200, "bfloat16", n, k)[4] for n, k in (
        ((heads + 2 * kv) * d, hidden), (hidden, heads * d), (2 * ffn, hidden), (hidden, ffn)))
    assert dec.tables_s > gemm   # attention on top
    attn = tables.pass_parts(tables.REGISTRY.curves(), np.array([_row()]), np.array([16.0]),
                             np.zeros(1), np.array([2049.0]), np.zeros(1), np.zeros(1))
    assert dec.tables_s == pytest.approx(gemm + attn["decode_attention"][0] / layers, rel=1e-9)
    # additivity: 6 / (3 + 5) measured
    assert both.additivity[0] == pytest.approx(0.75)
    assert both.additivity[1] == pytest.approx(both.tables_s / (dec.tables_s + chunk.tables_s))
    assert both.additivity[2] == pytest.approx(both.roofline_s
                                               / (dec.roofline_s + chunk.roofline_s))
    assert dec.additivity is None and chunk.additivity is None


def _row() -> int:
    from koi.catalog import load_catalog
    from koi.predictor.steps import step_config
    cat = load_catalog()
    cfg = step_config("llama-3.1-8b", 1, "h200", cat)
    return tables.REGISTRY.index(cat.model(cfg.model), cfg, cat.accelerator("h200"))


def test_the_shipped_h200_runs_compare_in_full() -> None:
    c = compare_kernels()
    assert len(c.envs) == 6   # three runs of gemm, ctx_attn and mixed; three of gen_attn
    kinds = {r.kind for r in c.cells}
    assert kinds == {"gemm bfloat16", "gemm fp8", "prefill attention bfloat16",
                     "decode attention bfloat16"}
    # six decode cells the table never measured (large batch × long context) are counted,
    # not compared
    assert c.off_grid == 6
    assert all(r.runs == 3 for r in c.cells)
    assert len(c.mixed) == 70 and all(r.runs == 3 for r in c.mixed)
    # the table's bf16 GEMM cells were measured on an H200 with cuBLAS-class kernels: the
    # lookup must land on the same cells (a transposed or shifted lookup misses by far more)
    bf16 = [r.ratio for r in c.cells if r.kind == "gemm bfloat16"]
    assert 0.9 < float(np.median(bf16)) < 1.1
    assert sum(r.additivity is not None for r in c.mixed) == 48


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not a readable JSON file"),
    ([1, 2], "expected an object"),
    ({"runs": []}, "expected a run"),
    ({"env": {}, "gemm": []}, "no gemm, ctx_attn, gen_attn, mixed points"),
    ({"env": {}, "gemm": [{"dtype": "bfloat16", "m": 1}]}, "needs dtype, m, n, k, s"),
    ({"env": {}, "gemm": [{"dtype": "bfloat16", "m": 1, "n": 64, "k": 64, "s": -1}]},
     "s must be a positive number"),
    ({"env": {}, "mixed": [mixed_row(1e-3, -4, 0)]}, "non-negative integers"),
    ({"env": {}, "mixed": [{**mixed_row(1e-3, 4, 0), "model": "no-such-model"}]},
     "no-such-model"),
])
def test_a_malformed_file_says_what_is_wrong(tmp_path: Path, content: object,
                                             message: str) -> None:
    with pytest.raises(KernelsFileError, match=r"kernels\.json") as err:
        compare_kernels(write(tmp_path, content))
    assert message in str(err.value)


def test_a_part_without_tables_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, {"env": {}, "mixed": [mixed_row(1e-3, 4, 0)]})
    with pytest.raises(KernelsFileError, match="no kernel tables ship for 'mi300x'"):
        compare_kernels(path, accelerator="mi300x")


def test_a_point_a_run_failed_to_measure_is_left_out(tmp_path: Path) -> None:
    rows = [mixed_row(3e-4, 16, 0), mixed_row(None, 0, 512), mixed_row(6e-4, 16, 512)]
    c = compare_kernels(write(tmp_path, {"env": {}, "mixed": rows}))
    assert [r.chunk for r in c.mixed] == [0, 512]
    assert c.mixed[1].additivity is None   # its chunk-only pass is missing


def test_cli_prints_the_summary_and_the_passes(tmp_path: Path) -> None:
    rows = [mixed_row(3e-4, 16, 0), mixed_row(5e-4, 0, 512), mixed_row(6e-4, 16, 512)]
    path = write(tmp_path, {"env": {"device": "NVIDIA H200"}, "mixed": rows})
    result = CliRunner().invoke(app, ["bench", "kernels", "--file", str(path), "--markdown",
                                      "--rows"])
    assert result.exit_code == 0, result.output
    assert "| measured t(b, c) ÷ (t(b, 0) + t(0, c)) | 0.75 | 0.75–0.75 | 1 |" in result.stdout
    assert "| llama-3.1-8b | 1 | 16 | 512 | 0 | 600.0 |" in result.stdout


def test_cli_exits_2_on_a_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "kernels", "--file", str(tmp_path / "no.json")])
    assert result.exit_code == 2
    assert "no such file" in " ".join(result.output.split())
