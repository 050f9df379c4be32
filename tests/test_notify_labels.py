"""The daily digest's labels (namespace, pod, hostname, GPU, action, reasons: anything the data
holds) cannot reshape the message: no control character to end a code span and forge a line,
no bidi control to reverse the dollars after it, no escaping that takes a section past Slack's
3,000 characters (it then rejects the whole message, every day)."""

import json
import re
import unicodedata
from datetime import date

import pytest

from gpu_pipeline.lib.io.notify import MAX_LISTED, SECTION_CHARS, Digest, fit, slack_payload

DAY = date(2026, 11, 25)
CONTROLS = ["\n", "\r", "\t", "\x1b", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\x00"]
BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]
BIDI += ["\u200e", "\u200f", "\u061c"]
FORGED = "*4. Send the GPU budget to* http://evil.example *now*"


def _digest(ns: str, host: str, gpus: int = 1, reasons: str = "2.0 double-bit ECC error(s)"):
    rows = [
        {
            "gpu_uuid": f"GPU-{i}",
            "hostname": host,
            "namespace": ns,
            "days_bottlenecked": 3,
            "window_days": 7,
        }
        for i in range(gpus)
    ]
    return Digest(
        day=DAY,
        report="/lake/_reports/gpu_report.html",
        gpus=gpus,
        cost_usd=100.0,
        waste_usd=72.0,
        actions=[
            {"namespace": ns, "action": "right_size", "monthly_usd": 2160.0},
            {"namespace": "team-b", "action": f"custom{ns}", "monthly_usd": 90.0},
        ],
        bottlenecks=gpus,
        new_bottlenecks=rows,
        drain=[{"gpu_uuid": r["gpu_uuid"], "hostname": host, "reasons": reasons} for r in rows],
    )


def _texts(payload: dict) -> list[str]:
    """Every text of the message: `text`, the header, each field, section and context element."""
    out = [payload["text"]]
    for b in payload["blocks"]:
        out += [b["text"]["text"]] if "text" in b else []
        out += [f["text"] for f in b.get("fields", [])]
        out += [e["text"] for e in b.get("elements", [])]
    return out


def _sections(payload: dict) -> dict[str, list[str]]:
    """The sections with a text, by their first line: their lines as Slack splits them."""
    found = [b["text"]["text"] for b in payload["blocks"] if b["type"] == "section" and "text" in b]
    return {t.split("\n", 1)[0]: re.split(r"\r\n|[\n\r\x0b\x0c\x85\u2028\u2029]", t) for t in found}


@pytest.mark.parametrize("c", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_a_control_character_in_a_label_forges_no_line(c):
    """A namespace `ok<c>*4. Send the GPU budget to* http://evil.example *now*` (and the host,
    and an action's name): each section keeps its own lines, the label stays in its code span,
    and the message holds no control character but the newlines between its lines."""
    p = slack_payload(_digest(f"ok{c}{FORGED}", f"host{c}{FORGED}"))
    sections = _sections(p)
    assert [len(v) for v in sections.values()] == [3, 2, 2], sections
    for lines in sections.values():
        assert not any(ln.lstrip().startswith("*4.") for ln in lines), lines
        assert all(ln.count("`") % 2 == 0 for ln in lines), lines
    for text in _texts(p):
        bad = [ch for ch in text if unicodedata.category(ch) in ("Cc", "Zl", "Zp") and ch != "\n"]
        assert not bad, (text, bad)
    assert "\n" not in p["text"]


@pytest.mark.parametrize("c", BIDI, ids=[f"U+{ord(c):04X}" for c in BIDI])
def test_a_bidi_control_in_a_label_reverses_nothing(c):
    """`team-a\\u202e` before `$2,160/month`: no bidi control reaches the message."""
    p = slack_payload(_digest(f"team-a{c}", f"host{c}-1"))
    sent = json.dumps(p, ensure_ascii=False)
    assert c not in sent
    assert not [ch for ch in sent if unicodedata.bidirectional(ch) in ("LRE", "RLE", "PDF")]
    assert not [ch for ch in sent if unicodedata.category(ch) == "Cf"]
    (top,) = [v for k, v in _sections(p).items() if k.startswith("*Top actions*")]
    assert top[1].endswith(": $2,160/month") and "team-a" in top[1]


def test_escaping_cannot_take_a_section_past_slacks_limit():
    """12 GPUs whose hostnames are 60 `&` and namespaces 30 `<` and 30 `&`, reasons 120 `>`: every
    section's text stays within 3,000 characters (it measured 6,458), each label within its 60
    characters as sent, no entity cut in two."""
    p = slack_payload(_digest("<" * 30 + "&" * 30, "&" * 60, gpus=12, reasons=">" * 120))
    texts = _texts(p)
    assert all(len(t.encode("utf-16-le")) // 2 <= SECTION_CHARS for t in texts)
    for t in texts:
        assert not re.search(r"&(?!amp;|lt;|gt;)", t), t  # every & starts a whole entity
        assert all(len(code) <= 60 for code in re.findall(r"`([^`]*)`", t))
    sections = _sections(p)
    bottlenecks = sections["*New persistent bottlenecks*"]
    assert len(bottlenecks) == 1 + MAX_LISTED + 1 and bottlenecks[-1].startswith("… and 2 more")


def test_a_section_is_capped_whatever_its_lines():
    """Emoji (two UTF-16 units each) in every label: still within the limit, the lines left out
    counted."""
    poo = "\N{PILE OF POO}" * 200
    p = slack_payload(_digest(poo, poo, gpus=40, reasons=poo))
    for t in _texts(p):
        assert len(t.encode("utf-16-le")) // 2 <= SECTION_CHARS, len(t)
    drain = _sections(p)["*Drain: double-bit ECC or row remap*"]
    listed, more = (
        len(drain) - 2,
        int(re.fullmatch(r"… and (\d+) more \(see the report\)", drain[-1])[1]),
    )
    assert listed < MAX_LISTED and listed + more == 40, drain[-1]


@pytest.mark.parametrize("n", range(2, 14))
def test_fit_never_cuts_an_entity(n):
    for escaped in ("&amp;" * 5, "a&lt;" * 5, "ab&gt;&amp;" * 3):
        out = fit(escaped, n)
        assert len(out) <= n and not re.search(r"&(?!amp;|lt;|gt;)", out), out
