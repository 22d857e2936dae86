"""What `--fault-drill` asks for (design §2.6): the tensor drill, or a fault injected
inside the computation (`op[:SPEC]`, `_inject`).

`--fault-drill` alone is the tensor drill: one flipped mantissa bit in the middle layer's
recorded output (`_runner.FaultDrill`). `--fault-drill op[:SPEC]` corrupts the output of
an aten op as it is computed and lets the workload run on, so what hardware would mask
(a ReLU, a max-pool, a softmax that saturates, rounding) is masked. SPEC is a comma list:

- a class (the first item may name it bare): `matmul`, `conv`, `reduction`,
  `elementwise`, `attention`, `collective` (default `matmul`);
- `seed=N` (default 0): draws the call, the element and the bits not named;
- `call=N`: the N-th call of an op of the class in the workload's run (default drawn);
- `element=N`: the flat index in that op's output (modulo its size; default drawn);
- `bit=sign|exponent|mantissa|N`: the field the bits are drawn from, or the lowest bit
  flipped (default: any bit of the word);
- `bits=K` (default 1): K bits flipped at once (drawn from the field; adjacent upwards
  from an explicit `bit=N`);
- `stuck`: a stuck lane: the same element and bits of every later call of the class are
  corrupted too, as a broken lane of a unit would.

This module does not import torch: the CLI parses the flag before any child starts.
"""

from __future__ import annotations

from dataclasses import dataclass

# The op classes (`_inject.op_class` maps each aten op to one).
OP_CLASSES = ("matmul", "conv", "reduction", "elementwise", "attention", "collective")
FIELDS = ("sign", "exponent", "mantissa", "any")
# `--fault-drill` with no value: the tensor drill of design §2.6.
TENSOR_DRILL = "tensor"


class DrillSpecError(ValueError):
    """A `--fault-drill` value that names no drill (exit 2, with this message)."""


@dataclass(frozen=True)
class OpDrillSpec:
    op_class: str = "matmul"
    seed: int = 0
    call: int | None = None
    element: int | None = None
    field: str = "any"
    bit: int | None = None
    bits: int = 1
    stuck: bool = False

    def text(self) -> str:
        """The canonical `op:...` spelling (what the result's `drill.spec` says)."""
        items = [self.op_class, f"seed={self.seed}"]
        if self.call is not None:
            items.append(f"call={self.call}")
        if self.element is not None:
            items.append(f"element={self.element}")
        if self.bit is not None:
            items.append(f"bit={self.bit}")
        elif self.field != "any":
            items.append(f"bit={self.field}")
        if self.bits != 1:
            items.append(f"bits={self.bits}")
        if self.stuck:
            items.append("stuck")
        return "op:" + ",".join(items)


def _count(key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise DrillSpecError(f"--fault-drill: {key}={value!r} is not a whole number") from None
    if number < 0:
        raise DrillSpecError(f"--fault-drill: {key} must be 0 or more, not {number}")
    return number


def parse_drill(value: str | bool | None) -> OpDrillSpec | str | None:
    """None (no drill), `TENSOR_DRILL`, or the op drill `value` names. Raises
    DrillSpecError naming what is wrong."""
    if value is None or value is False:
        return None
    if value is True or value in ("", TENSOR_DRILL):
        return TENSOR_DRILL
    assert isinstance(value, str)
    head, sep, rest = value.partition(":")
    if head != "op":
        raise DrillSpecError(f"--fault-drill takes no value (the tensor drill) or op[:SPEC], "
                             f"not {value!r}")
    fields: dict[str, object] = {}
    items = [item.strip() for item in rest.split(",")] if sep else []
    for position, item in enumerate(items):
        key, eq, raw = item.partition("=")
        if not eq and key in OP_CLASSES and position == 0:
            fields["op_class"] = key
        elif not eq and key == "stuck":
            fields["stuck"] = True
        elif key == "class" and eq:
            if raw not in OP_CLASSES:
                raise DrillSpecError(f"--fault-drill: class {raw!r} is none of "
                                     f"{', '.join(OP_CLASSES)}")
            fields["op_class"] = raw
        elif key in ("seed", "call", "element", "bits") and eq:
            fields[key] = _count(key, raw)
        elif key == "bit" and eq:
            if raw in FIELDS:
                fields["field"] = raw
            else:
                fields["bit"] = _count(key, raw)
        else:
            raise DrillSpecError(
                f"--fault-drill: {item!r} is not a class ({', '.join(OP_CLASSES)}) nor "
                "seed=, call=, element=, bit=sign|exponent|mantissa|N, bits=K or stuck")
    spec = OpDrillSpec(**fields)  # type: ignore[arg-type]
    if spec.bits < 1:
        raise DrillSpecError("--fault-drill: bits must be 1 or more")
    return spec


def drill_text(drill: OpDrillSpec | str | None) -> str | None:
    """What travels to a child (`_child`'s spec `fault_drill`): the canonical text."""
    if drill is None:
        return None
    return drill if isinstance(drill, str) else drill.text()
