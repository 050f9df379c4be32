"""Prometheus HTTP API dumps: `/api/v1/query` (vector) and `/api/v1/query_range` (matrix) JSON.

Values are strings ("NaN" possible); timestamps float seconds. Records are numbered in document
order (series by series, point by point); that number stands in for a line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

import polars as pl

from gpu_pipeline.lib.ingest.formats.common import (
    Context,
    metric_column,
    metric_scale,
    parsed,
    resolve_aliases,
)
from gpu_pipeline.lib.samples import ParsedLines


class WholeFile(ValueError):
    """The file as a whole cannot be used; the message is the quarantine reason."""


_OBJECT = re.compile(rb"\s*(\{|\[\s*\{)")  # an object, or an array of objects


def detect(data: bytes, name: str) -> bool:
    """Any JSON object (or array of objects): the parse says what a document that is not an
    API response lacks."""
    return _OBJECT.match(data) is not None


def _points(r: dict, rtype: str) -> list:
    pts = r.get("values") if rtype == "matrix" else [r.get("value")]
    return pts if isinstance(pts, list) else [pts]


def parse(text: str, ctx: Context) -> ParsedLines:
    """A query or query_range answer -> its samples; each record stands in for a line. Of
    answers one after another whose last is cut short, that last is one record, quarantined."""
    doc, rtype, results, cut = _response(text)
    g = _candidates(len(results), *_records(results, rtype))
    if cut is not None:
        g = _with_cut_tail(g, *cut)
    # series that are not GPU telemetry (node_*, up, an exporter's own): skipped, not rejected
    other = ~pl.col("metric").str.to_lowercase().str.starts_with("dcgm") & (pl.col("metric") != "?")
    skipped = int(g.select(other.sum()).item())
    if skipped:
        g = g.filter(~other)
    out = parsed(
        g,
        lines_total=g.height + skipped,
        lines_skipped=skipped,
        window=ctx.time_window(),
        source_file=ctx.source_file,
        # the cut tail quotes its own text
        raw=pl.coalesce("raw", RAW) if "raw" in g.columns else RAW,
    )
    out.fields = sorted(set(g.get_column("column").unique().drop_nulls().to_list()))
    prov = doc.get("gpu_pipeline")  # written by `gpu-pipeline pull`: the server and the query
    if isinstance(prov, dict) and prov.get("server"):
        out.origin = f"{prov.get('server')} {prov.get('query', '')}".strip()[:500]
    return out


def _response(text: str) -> tuple[dict, str, list, tuple[str, str] | None]:
    """The document, its result type ("matrix" or "vector"), its list of series and the cut
    tail (`_concatenated`); WholeFile, with the reason, when `text` is not a query or
    query_range answer. Several answers, one after another (JSON Lines) or in an array, are
    one matrix of all their series (refused whole before, with "truncated": adversarial
    review)."""
    docs, cut = _documents(text)
    if len(docs) == 1:
        return docs[0], *_answer(docs[0]), cut
    results: list = []
    for doc in docs:
        rtype, res = _answer(doc)
        if rtype == "vector":  # a point as a one-point matrix series
            res = [
                {"metric": r.get("metric"), "values": [r.get("value")]}
                if isinstance(r, dict)
                else r
                for r in res
            ]
        results += res
    return docs[0], "matrix", results, cut


def _documents(text: str) -> tuple[list[dict], tuple[str, str] | None]:
    """The file's JSON objects (one, several one after another, or an array of them) and the
    cut tail of those one after another (`_concatenated`)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg != "Extra data":
            raise WholeFile(
                f"not valid JSON at line {e.lineno} column {e.colno} ({e.msg}): truncated or not "
                "an API response"
            ) from None
        return _concatenated(text)
    except RecursionError:  # the parser recurses per level: a 200k-deep document is not an answer
        raise WholeFile(
            "not a Prometheus API response: nested too deep (an API answer is a few levels deep)"
        ) from None
    if isinstance(doc, list) and doc and all(isinstance(d, dict) for d in doc):
        return doc, None
    if not isinstance(doc, dict):
        raise WholeFile(
            "not a Prometheus API response: the top level is not an object "
            '{"status": ..., "data": {...}} (nor an array of them)'
        )
    return [doc], None


def _concatenated(text: str) -> tuple[list[dict], tuple[str, str] | None]:
    """JSON objects written one after another (JSON Lines), and the file's tail after the
    last whole one when it is not JSON (the last answer cut short: a writer stopped while
    writing it) as (its text, why it is not read): kept as one quarantined record, as a cut
    last snapshot of nvidia-smi XML is. WholeFile where an object that is not the last one
    does not decode (a later line holds a whole answer)."""
    dec, docs, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if i == len(text):
            return docs, None
        try:
            doc, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            if _last_answer(text, i, dec):
                return docs, (
                    text[i:],
                    f"not valid JSON at line {e.lineno} column {e.colno} ({e.msg}) after "
                    f"{len(docs)} whole answers: the last answer cut short (the writer stopped "
                    "while writing it), or text that is not an answer; not read",
                )
            raise WholeFile(
                f"not valid JSON at line {e.lineno} column {e.colno} ({e.msg}), after "
                f"{len(docs)} whole answers: truncated or not an API response"
            ) from None
        except RecursionError:
            raise WholeFile("not a Prometheus API response: nested too deep") from None
        if not isinstance(doc, dict):
            raise WholeFile(f"answer {len(docs) + 1} of the file is not a JSON object")
        docs.append(doc)


def _last_answer(text: str, i: int, dec: json.JSONDecoder) -> bool:
    """Whether the text from `i`, which does not decode, is the file's last answer: no later
    line starts a JSON object that decodes whole (one that does: the damage is between
    answers, and the file is refused whole, as before)."""
    j = text.find("\n", i)
    while j != -1:
        if text.startswith("{", j + 1):
            try:
                dec.raw_decode(text, j + 1)
                return False
            except (json.JSONDecodeError, RecursionError):
                pass
        j = text.find("\n", j + 1)
    return True


def _with_cut_tail(g: pl.DataFrame, tail: str, why: str) -> pl.DataFrame:
    """The candidate records and, after them, the cut tail as one record: numbered after the
    last, no series name (so not skipped as another metric's), quarantined for `why`."""
    line = (g.get_column("line").max() or 0) + 1
    row = pl.DataFrame(
        {"line": [line], "metric": ["?"], "raw": [tail], "pre_reason": [why]},
        schema={"line": pl.Int64, "metric": pl.String, "raw": pl.String, "pre_reason": pl.String},
    )
    return pl.concat([g, row], how="diagonal_relaxed")


def _answer(doc: dict) -> tuple[str, list]:
    """One answer's result type and series; WholeFile when it is not a query answer."""
    if doc.get("status") == "error":
        raise WholeFile(
            f"Prometheus API error: {doc.get('errorType', '?')}: {doc.get('error', '?')}"
        )
    data = doc.get("data")
    if not isinstance(data, dict):
        raise WholeFile(
            'field "data" is not an object {"resultType": ..., "result": [...]}: not a query '
            "or query_range response"
        )
    rtype = data.get("resultType")
    if rtype not in ("matrix", "vector"):
        raise WholeFile(
            f'field "data.resultType" is {rtype!r}: only "matrix" (query_range) and "vector" '
            "(query) carry samples"
        )
    results = data.get("result")
    if results is None:
        results = []
    if not isinstance(results, list):
        raise WholeFile('field "data.result" is not a list of series')
    return rtype, results


def _records(results: list, rtype: str) -> tuple[dict[str, list], dict[str, list], dict[str, list]]:
    """The series in document order, walked once: every point a record (series number,
    timestamp, value text, reason it can't be read) and a series that is not an object one
    record; each series' name and labels (as JSON); its label pairs (series number, key, value)."""
    points = "values" if rtype == "matrix" else "value"
    shape = '[timestamp, "value"]'

    series, ts, vals, pre, metric, labels_json = [], [], [], [], [], []
    pair_s, pair_k, pair_v = [], [], []
    for i, r in enumerate(results):
        labels = r.get("metric") if isinstance(r, dict) else None
        labels = labels if isinstance(labels, dict) else {}
        labels_json.append(json.dumps(labels, separators=(",", ":")))
        metric.append(labels.get("__name__"))
        for k, v in labels.items():
            pair_s.append(i)
            pair_k.append(k)
            pair_v.append(str(v))
        if not isinstance(r, dict):
            series.append(i)
            ts.append(None)
            vals.append(json.dumps(r)[:200])
            pre.append(
                f'data.result[{i}] is not a series object {{"metric": {{...}}, "{points}": ...}}'
            )
            continue
        pts = _points(r, rtype)
        if all(type(p) is list and len(p) == 2 for p in pts):  # the usual series, in bulk
            at, said = zip(*pts, strict=True) if pts else ((), ())
            if all(type(t) is int or type(t) is float for t in at):  # not bool, not text
                series += [i] * len(pts)
                ts += at
                vals += map(str, said)
                pre += [None] * len(pts)
                continue
        for j, p in enumerate(pts):
            series.append(i)
            where = f"data.result[{i}].{points}" + (f"[{j}]" if rtype == "matrix" else "")
            if isinstance(p, list) and len(p) == 2:
                # JSON true/false are Python bools, which are ints: not a time
                is_num = isinstance(p[0], int | float) and not isinstance(p[0], bool)
                ts.append(p[0] if is_num else None)
                vals.append(str(p[1]))
                pre.append(
                    None if is_num else f"{where}: the timestamp is not a number, expected {shape}"
                )
            else:
                ts.append(None)
                vals.append(json.dumps(p)[:200])
                pre.append(f"{where} is not {shape}")
    records = {"series": series, "ts": ts, "value_s": vals, "pre_reason": pre}
    names = {"metric": metric, "labels_json": labels_json}
    return records, names, {"series": pair_s, "k": pair_k, "v": pair_v}


def _candidates(
    n_series: int, records: dict[str, list], names: dict[str, list], pairs: dict[str, list]
) -> pl.DataFrame:
    """The records as candidate lines (numbered from 1 in document order), with their series'
    name, attributes, field, unit scale, a `raw` text that quotes them, and the reasons known
    before `finalize` (no __name__, a timestamp out of range)."""
    per_series = pl.DataFrame(
        {"series": range(n_series), **names},
        schema={"series": pl.Int64, "metric": pl.String, "labels_json": pl.String},
    )
    attrs = resolve_aliases(
        pl.DataFrame(pairs, schema={"series": pl.Int64, "k": pl.String, "v": pl.String}),
        "series",
    )
    return (
        pl.DataFrame(
            records,
            schema={
                "series": pl.Int64,
                "ts": pl.Float64,
                "value_s": pl.String,
                "pre_reason": pl.String,
            },
        )
        .with_row_index("line", offset=1)
        .with_columns(pl.col("line").cast(pl.Int64))
        .join(per_series, on="series", how="left")
        .join(attrs, on="series", how="left")
        .with_columns(
            (pl.col("ts") * 1000.0).round(0).cast(pl.Int64, strict=False).alias("ts_ms"),
            pl.col("value_s").cast(pl.Float64, strict=False).alias("value"),
            metric_column(pl.col("metric")).alias("column"),
            metric_scale(pl.col("metric")).alias("scale"),
            pl.when(pl.col("pre_reason").is_not_null())
            .then(pl.col("pre_reason"))
            .when(pl.col("metric").is_null())
            .then(pl.lit("series has no __name__ label (an expression result?)"))
            .when(
                pl.col("ts").is_not_null()
                & (pl.col("ts") * 1000.0).round(0).cast(pl.Int64, strict=False).is_null()
            )
            .then(pl.format("timestamp out of range: {}", pl.col("ts").cast(pl.String)))
            .alias("pre_reason"),
        )
        .with_columns(pl.col("metric").fill_null("?"))
    )


# a rejected record's quote: its series' labels and its point (`finalize` makes it for the
# rejected records only)
RAW = pl.concat_str(
    pl.lit('{"metric":'),
    pl.col("labels_json"),
    pl.lit(',"value":['),
    pl.col("ts").cast(pl.String).fill_null("null"),
    pl.lit(',"'),
    pl.col("value_s"),
    pl.lit('"]}'),
)


# A large answer is read a run of whole series at a time (`landing.PieceParse`): each run is
# framed as an answer of its own, with the text before the first series in front of it and the
# brackets that text leaves open after it. `{"metric": {` starts a series: in valid JSON that
# byte sequence cannot be inside a string (its quotes would end the string), and a label's
# value is a string, never an object.
_SERIES_START = re.compile(rb'\{\s*"metric"\s*:\s*\{')
_WS = b" \t\r\n"


# an answer larger than this is parsed a run of its series at a time: parsed whole, an answer
# takes ~60 times its size in Python objects (a 64 MiB one peaked at 4.0 GiB, in runs of 4 MiB
# it takes ~0.3 GiB; benchmarks/README.md)
RUN_BYTES = 4 * 2**20


def series_cut(buf: bytes | bytearray, end: int, start: int = 0) -> int:
    """Where `buf` can be cut after `start` and before `end` between two series of an answer's
    result list: just after the `}` that closes a series, followed by `, {"metric": {`; 0 when
    there is no such place (a series longer than that, or not an answer)."""
    at = end
    while (j := buf.rfind(b'"metric"', start, at)) > start:
        at = j
        brace = _skip_back(buf, j - 1)
        if brace < 0 or buf[brace] != 0x7B or not _SERIES_START.match(buf, brace):
            continue
        comma = _skip_back(buf, brace - 1)
        if comma < 0 or buf[comma] != 0x2C:
            continue
        close = _skip_back(buf, comma - 1)
        if close >= 0 and buf[close] == 0x7D:
            return close + 1
    return 0


def frame(head: bytes) -> tuple[bytes, bytes] | None:
    """The text of an answer before its first series and the brackets that text leaves open,
    closed (`]}}` for a query_range answer): what a later run of its series is framed with.
    None when `head` starts no series list (not an answer, or its first series not in it)."""
    m = _SERIES_START.search(head, 0, 2**20)
    if m is None:
        return None
    prefix = head[: m.start()]
    stack: list[int] = []
    in_str = esc = False
    for c in prefix:
        if in_str:
            esc, in_str = (False, True) if esc else (c == 0x5C, c != 0x22)
        elif c == 0x22:
            in_str = True
        elif c in (0x7B, 0x5B):
            stack.append(c)
        elif c in (0x7D, 0x5D) and (not stack or stack.pop() != c - 2):
            return None  # `}` closes `{` (0x7B), `]` closes `[` (0x5B): each two apart
    if in_str or not stack or stack[-1] != 0x5B:
        return None
    return prefix, bytes(c + 2 for c in reversed(stack))


def runs(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """Pieces of an answer cut between its series, each cut again into runs of at most
    RUN_BYTES where it can be (`series_cut`)."""
    for piece in pieces:
        start = 0
        while len(piece) - start > RUN_BYTES and (
            cut := series_cut(piece, start + RUN_BYTES, start)
        ):
            yield piece[start:cut]
            start = cut
        yield piece[start:] if start else piece


def series_in(run: bytes) -> int:
    """How many series start in a run of an answer's series (`series_cut`)."""
    return len(_SERIES_START.findall(run))


def renumbered(quarantine: pl.DataFrame, first: int) -> pl.DataFrame:
    """The quarantine of a run of series whose first is the answer's series `first`: its
    reasons' `data.result[i]` said of the whole answer, as a parse of it whole says them."""
    at = r"^data\.result\[(\d+)\]"
    i = pl.col("reason").str.extract(at, 1).cast(pl.Int64)
    return quarantine.with_columns(
        pl.when(i.is_not_null())
        .then(pl.format("data.result[{}]{}", i + first, pl.col("reason").str.replace(at, "")))
        .otherwise(pl.col("reason"))
        .alias("reason")
    )


def _skip_back(buf: bytes | bytearray, i: int) -> int:
    """The index of the last byte at or before `i` that is not white space (-1: none)."""
    while i >= 0 and buf[i] in _WS:
        i -= 1
    return i
