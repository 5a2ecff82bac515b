"""Shape lists: the grid of the command line and JSON/CSV files."""

import json

import pytest

from fa4.problem import Problem
from tests.tuner.test_cli import fa4_tune
from tuner.shapes import ShapeError, grid, load_shapes, parse_int_list

CLI_DEFAULTS = {"dtype": "bf16", "causal": False, "deterministic": False, "pass_": "fwd"}


def test_grid_is_seqlen_major_with_the_standard_convention():
    got = grid([1024, 2048, 4096], [64, 128], CLI_DEFAULTS)
    assert [(p.seqlen_q, p.head_dim) for p in got] == [(1024, 64), (1024, 128), (2048, 64), (2048, 128),
                                                       (4096, 64), (4096, 128)]
    assert got[0] == Problem.standard(1024, 64)
    assert got[0].batch * got[0].seqlen_q == 16384 and got[1].heads_q * got[1].head_dim == 2048


def test_json_file_short_and_full_entries(tmp_path):
    full = Problem.standard(8192, 128, causal=True).to_dict()
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"seqlen": 4096, "hdim": 64}, {"seqlen": 2048, "hdim": 128, "causal": True,
                                                               "heads_kv": 4}, full, {"seqlen": 4096, "hdim": 64}]))
    got = load_shapes(path, {"dtype": "fp16"})
    assert got == [Problem.standard(4096, 64, dtype="fp16"),
                   Problem.standard(2048, 128, causal=True, heads_kv=4, dtype="fp16"),
                   Problem.from_dict(full)]  # the repeated entry is one study, listed once


def test_csv_file_with_header(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("seqlen,hdim,causal,pass\n1024,64,1,fwd\n8192,128,false,bwd\n")
    assert load_shapes(path, {}) == [Problem.standard(1024, 64, causal=True),
                                     Problem.standard(8192, 128, pass_="bwd")]


@pytest.mark.parametrize("text,needle", [
    ('[{"seqlen": 1024}]', "entry 1: a shape needs seqlen and hdim"),
    ('[{"seqlen": 1024, "hdim": 64, "tile_n": 128}]', "unknown shape field(s) tile_n"),
    ('[{"seqlen": -4, "hdim": 64}]', "seqlen must be a positive integer"),
    ('{"a": 1}', "expected a JSON list of objects"),
    ("[]", "lists no shapes"),
    ('[{"seqlen": 1024, "hdim": 64, "causal": "maybe"}]', "not a boolean"),
])
def test_bad_files_say_what_is_wrong(tmp_path, text, needle):
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(ShapeError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_shapes(path, {})


def test_parse_int_list():
    assert parse_int_list("--seqlen", "8192") == [8192]
    assert parse_int_list("--seqlen", "1024, 2048") == [1024, 2048]
    with pytest.raises(ShapeError, match="comma-separated"):
        parse_int_list("--seqlen", "1k")


@pytest.mark.parametrize("args,needle", [
    (["--seqlen", "8192,abc", "--hdim", "128"], "--seqlen takes integers"),
    (["--hdim", "128"], "--seqlen, --hdim (or --shapes FILE)"),
    (["--shapes", "/nonexistent/s.json"], "cannot read --shapes"),
])
def test_cli_shape_errors_are_one_line_exit_2(tmp_path, args, needle):
    r = fa4_tune(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr


def test_cli_shapes_and_seqlen_together_is_an_error(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('[{"seqlen": 1024, "hdim": 64}]')
    r = fa4_tune("--shapes", str(path), "--seqlen", "1024", "--hdim", "64")
    assert r.returncode == 2 and "either --shapes FILE or --seqlen/--hdim" in r.stderr


def test_a_grid_for_a_gpu_provider_without_a_gpu_reports_every_shape(tmp_path):
    r = fa4_tune("--seqlen", "4096,8192", "--hdim", "128", "--devices", "0,1", "--provider", "flash-attn-4",
                 "--json")
    assert r.returncode == 0, r.stderr
    reports = json.loads(r.stdout)
    assert [rep["problem"] for rep in reports] == [Problem.standard(s, 128).to_dict() for s in (4096, 8192)]
    assert all("timing needs a CUDA GPU" in rep["timing"] for rep in reports)


def test_value_head_dim_from_the_command_line_and_from_files(tmp_path):
    from tuner.cli import _shape_label, build_parser, problems_from_args

    a = build_parser().parse_args(["--seqlen", "8192", "--hdim", "192", "--hdim-v", "128", "--pass", "bwd"])
    (p,) = problems_from_args(a)
    assert (p.head_dim, p.head_dim_v, p.heads_q, p.pass_) == (192, 128, 2048 // 192, "bwd")
    assert " d192/128 " in _shape_label(p) and "d128/128" not in _shape_label(Problem.standard(1024, 128))
    path = tmp_path / "s.csv"
    path.write_text("seqlen,hdim,hdim_v,causal\n4096,192,128,1\n4096,192,,0\n")
    assert load_shapes(path, {}) == [Problem.standard(4096, 192, head_dim_v=128, causal=True),
                                     Problem.standard(4096, 192)]


def test_cli_value_head_dim_must_be_positive(tmp_path):
    r = fa4_tune("--seqlen", "1024", "--hdim", "192", "--hdim-v", "0")
    assert r.returncode == 2 and "--hdim-v must be a positive integer" in r.stderr, r.stderr


def test_cli_parses_the_feature_flags():
    import pytest

    from tuner.cli import build_parser, problems_from_args

    a = build_parser().parse_args(["--seqlen", "16384", "--hdim", "128", "--window", "1023,0", "--softcap", "30",
                                   "--sink", "--causal"])
    (p,) = problems_from_args(a)
    assert (p.window_left, p.window_right, p.softcap, p.sink, p.causal) == (1023, 0, 30.0, True, True)
    (p,) = problems_from_args(build_parser().parse_args(["--seqlen", "4096", "--hdim", "64", "--window", "128,"]))
    assert (p.window_left, p.window_right, p.softcap, p.sink) == (128, -1, 0.0, False)
    (p,) = problems_from_args(build_parser().parse_args(["--seqlen", "4096", "--hdim", "64"]))
    assert p.features() == {}
    for bad in (["--window", "5"], ["--window", "a,b"], ["--window", "-3,0"], ["--softcap", "-1"]):
        with pytest.raises(SystemExit):
            problems_from_args(build_parser().parse_args(["--seqlen", "4096", "--hdim", "64", *bad]))
