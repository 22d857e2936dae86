import ast
import math
import sys
from pathlib import Path

import pytest

import numparity_server.analysis as analysis
from numparity_server.analysis import Tolerance, judge


def test_multiplier_two_for_float32_three_for_half():
    assert judge(2e-7, 1e-7, "float32", 0.0).acceptable is True
    assert judge(2.1e-7, 1e-7, "float32", 0.0).acceptable is False
    assert judge(3e-7, 1e-7, "float16", 0.0).acceptable is True
    assert judge(3e-7, 1e-7, "bfloat16", 0.0).multiplier == 3.0
    assert judge(3.1e-7, 1e-7, "float16", 0.0).acceptable is False


def test_tol_over_ten_is_added():
    result = judge(1.5e-4, 1e-7, "float32", 1e-3)
    assert result.limit == pytest.approx(2e-7 + 1e-4)
    assert result.acceptable is False
    assert judge(1e-4, 1e-7, "float32", 1e-3).acceptable is True


def test_default_tol_is_ten_rtol():
    assert judge(0.0, 0.0, "float16").limit == pytest.approx(1e-3)
    assert judge(0.0, 0.0, "float32", Tolerance(rtol=1e-4, atol=0.0)).limit == pytest.approx(1e-4)


def test_nonfinite_and_missing():
    assert judge(math.nan, 1e-7, "float32").acceptable is False
    assert judge(math.inf, 1e-7, "float32").acceptable is False
    assert judge(None, 1e-7, "float32").acceptable is None
    missing_baseline = judge(1e-7, None, "float32")
    assert (missing_baseline.acceptable, missing_baseline.limit) == (None, None)
    assert judge(math.nan, 1e-7, "float32").to_dict()["rmse"] is None


def test_analysis_package_imports_only_numpy_and_stdlib():
    allowed = set(sys.stdlib_module_names) | {"numpy"}
    for source in Path(analysis.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert roots <= allowed, f"{source.name} imports {roots - allowed}"
