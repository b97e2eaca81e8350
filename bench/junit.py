"""JUnit XML for `bench check`: one test case per pair × contract line, so a CI system (GitHub
Actions' test reporters, GitLab, Jenkins) lists each broken line by name.

    <testsuites><testsuite name="bench check" tests=… failures=… time=…>
      <properties><property name="model" value="tiny-math"/>…</properties>
      <testcase classname="bench.check.fp16" name="kl_k3" time="0"/>
      <testcase classname="bench.check.fp16" name="noise_rollout">
        <failure message="3.1e-05 differs from 0 (bitwise)" type="contract">…where it enters…</failure>
      </testcase>
    </testsuite></testsuites>
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from bench.contract import Verdict


def junit_xml(verdicts: list[Verdict], properties: dict[str, str], seconds: float,
              details: dict[str, str] | None = None) -> str:
    """The XML text; `details` {pair: text} goes into each failure of that pair (where the
    mismatch enters)."""
    details = details or {}
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="bench check", tests=str(len(verdicts)),
                          failures=str(sum(not v.ok for v in verdicts)), errors="0", time=f"{seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    for k, v in properties.items():
        ET.SubElement(props, "property", name=k, value=str(v))
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"bench.check.{v.pair}", name=v.metric, time="0")
        if not v.ok:
            ET.SubElement(case, "failure", message=v.reason, type="contract").text = details.get(v.pair, "")
        else:
            ET.SubElement(case, "system-out").text = "" if v.value is None else f"{v.value:.6g}"
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write(path: str | Path, text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
