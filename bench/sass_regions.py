"""Registers and spills of each warpgroup role of the sm90 kernels, from their SASS: the code
reachable from each `setmaxnreg` (USETMAXREG.TRY_ALLOC: the GEMM warpgroups; .DEALLOC: the
gather) by the control flow, the highest register it touches (it must stay below the
setmaxnreg value: ptxas does not report a role that exceeds it) and its local-memory spills
(STL/LDL); and for a GEMM role how far its first HGMMA is from its setmaxnreg (the code it
runs once, cold, at every CTA's start):

  python -m bench.sass_regions OBJECT_OR_SASS [--cuobjdump PATH]

OBJECT_OR_SASS: a .o/.so built from cutlass_kernels/sm90 (cuobjdump -sass is run on it) or the
text cuobjdump printed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    found: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in sass.splitlines():
        name = re.search(r"Function : (\S+)", line)
        if name:
            current = name.group(1)
            found[current] = []
            continue
        match = INSTRUCTION.match(line)
        if current and match:
            found[current].append((int(match.group(1), 16), match.group(2).strip()))
    return found


def reachable(code: list[tuple[int, str]], start: int) -> tuple[set[int], bool]:
    """Indices of the instructions reachable from code[start] (branch and call targets and
    fall-through), and whether an indirect branch (BRX, JMX) left some targets unknown."""
    index_of = {address: i for i, (address, _) in enumerate(code)}
    seen: set[int] = set()
    todo = [start]
    indirect = False
    while todo:
        i = todo.pop()
        if i in seen or i >= len(code):
            continue
        seen.add(i)
        text = code[i][1]
        predicated = text.startswith("@")
        opcode = PREDICATE.sub("", text).split()[0]
        if opcode.startswith(("BRX", "JMX")):
            indirect = True
            if predicated:
                todo.append(i + 1)
        elif opcode.startswith(("BRA", "JMP", "CALL")):
            target = re.search(r"0x([0-9a-f]+)", text)
            if target and int(target.group(1), 16) in index_of:
                todo.append(index_of[int(target.group(1), 16)])
            if predicated or opcode.startswith("CALL"):  # a call returns to the next instruction
                todo.append(i + 1)
        elif opcode.startswith(("EXIT", "RET")):
            if predicated:
                todo.append(i + 1)
        else:
            todo.append(i + 1)
    return seen, indirect


def register_width(opcode: str) -> int:
    """How many registers from its base a wide operand of this instruction takes."""
    if re.match(r"(LDSM|STSM)\b.*\.4\b", opcode) or ".128" in opcode:
        return 4
    if re.match(r"(LDSM|STSM)\b.*\.2\b", opcode) or ".64" in opcode or ".WIDE" in opcode:
        return 2
    if opcode.split(".")[0] in ("DADD", "DMUL", "DFMA", "DSETP", "DMNMX") or ".F64" in opcode:
        return 2
    return 1


def highest_register(text: str) -> int:
    """The highest register an instruction may touch, counting the registers after a base register
    that wide operands use (an over-estimate where a wide instruction also names narrow ones):
    .64 / .WIDE / F64 two, .128 four, ldmatrix / stmatrix .x4 four (.x2 two), an HGMMA's fp32
    accumulator N / 2 for 64 x N, and its A operand four when it comes from registers."""
    opcode = PREDICATE.sub("", text).split()[0]
    registers = [int(r) for r in re.findall(r"\bR(\d+)\b", text)]
    if not registers:
        return -1
    gmma = re.match(r"HGMMA\.64x(\d+)x\d+\.F32", opcode)
    if gmma:
        highest = registers[0] + int(gmma.group(1)) // 2 - 1  # the accumulator is the first operand
        operands = PREDICATE.sub("", text).split(None, 1)[1].split(",")
        a_operand = re.match(r"\s*R(\d+)", operands[1]) if len(operands) > 1 else None
        if a_operand:
            highest = max(highest, int(a_operand.group(1)) + 3)
        return max([highest] + registers[1:])
    width = register_width(opcode)
    if width > 1 and opcode.startswith(("STSM", "LDSM")):
        # Only the data operand is wide (stmatrix's last, ldmatrix's first); the address is one register.
        data = registers[-1] if opcode.startswith("STSM") else registers[0]
        return max(max(registers), data + width - 1)
    return max(registers) + width - 1


def report(code: list[tuple[int, str]]) -> list[str]:
    lines = []
    for i, (_, text) in enumerate(code):
        if "USETMAXREG" not in text:
            continue
        limit = re.search(r"0x([0-9a-f]+)", text)
        role = "gather (DEALLOC)" if "DEALLOC" in text else "GEMM (TRY_ALLOC)"
        region, indirect = reachable(code, i)
        highest = max((highest_register(code[j][1]) for j in region), default=-1)
        spills = sum(1 for j in region if re.search(r"\b(STL|LDL)\b", code[j][1]))
        cap = int(limit.group(1), 16) if limit else None
        verdict = "" if cap is None else (" OK" if highest < cap else f" ABOVE setmaxnreg {cap}")
        # The code a GEMM role runs once, cold, before its first GEMM: fetched from L2 at every CTA's
        # start (the span in address order, branches over rare paths included).
        first_gemm = next((j for j in range(i, len(code)) if "HGMMA" in code[j][1]), None)
        prologue = f", first HGMMA {first_gemm - i} instructions in" if role.startswith("GEMM") and first_gemm is not None else ""
        lines.append(f"  {role:17} setmaxnreg {cap}: {len(region)} instructions, up to R{highest}{verdict}, "
                     f"{spills} spill instructions{prologue}" + (" (indirect branches: incomplete)" if indirect else ""))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path")
    parser.add_argument("--cuobjdump", default=os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or "cuobjdump")
    args = parser.parse_args(argv)
    if args.path.endswith((".o", ".so", ".cubin")):
        sass = subprocess.run([args.cuobjdump, "-sass", args.path], capture_output=True, text=True, check=True).stdout
    else:
        sass = open(args.path).read()
    bad = False
    for name, code in functions(sass).items():
        lines = report(code)
        if lines:
            print(name)
            print("\n".join(lines))
            bad |= any("ABOVE" in line for line in lines)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
