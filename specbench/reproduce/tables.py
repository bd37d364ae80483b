"""Paper-vs-measured tables: each published number (``paper_values/*.csv``) beside the number measured
in the stored runs of the same setting, compared like with like.

A paper row names our model, dataset, method config, the knobs it changes from the method's
defaults (``setting``) and the temperature; the measured value comes from the runs that match all of
them (at a stand-in scale the plan's stand-in model replaces every paper model, so one measurement
stands in for several paper rows: it is shown once, beside the paper's values of the rows it stands
in for). Repeats give mean and std; speedups come from pairing each run with its AR run
(``report.compare.match_ar``) and carry the report's bootstrap interval; a metric no run stores (ANPD's
theoretical speedup α·K + 1) is computed once, here, from the matched runs' measured columns and knobs
(``DERIVED_METRICS``). Numbers of different hardware and models are never subtracted: a table ranks the
methods of one dataset and metric on each side (paper rank beside measured rank), puts tokens per step
side by side, and shows a published sweep relative to its default setting. Each table names the commits
that measured its runs and warns on a mix.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from omegaconf import OmegaConf

from specbench.config import find_config
from specbench.report.compare import commit_text, provenance_warning
from specbench.reproduce.results import Results, format_value, knob, setting_text, stamp

PAPER_COLUMNS = [
    "paper",
    "table",
    "paper_model",
    "model",
    "draft",
    "dataset",
    "paper_method",
    "method",
    "setting",
    "temperature",
    "metric",
    "value",
    "std",
    "note",
    "unfillable",
]
MEASURED_METRICS = {
    "throughput": "throughput_total",
    "speedup": "speedup",
    "tokens_per_step": "tokens_per_step",
    "overhead": "overhead",
    "peak_memory_gib": "peak_memory_gib",
    "draft_hit_ratio": "draft_efficiency",
    "theoretical_speedup": "theoretical_speedup",  # derived from draft_efficiency and K: DERIVED_METRICS
}
"""Paper metric -> the runs' column that measures it (a derived metric's column is computed by ``with_derived``)."""
PAIRED = ("speedup", "overhead")
"""Metrics measured against the AR run of the same setting (its commit counts too)."""
LOWER_IS_BETTER = ("overhead", "peak_memory_gib", "latency_s")
METRIC_NAMES = {
    "throughput": "tok/s",
    "speedup": "speedup (×)",
    "tokens_per_step": "tokens/step",
    "overhead": "overhead (×)",
    "peak_memory_gib": "peak memory (GiB)",
    "draft_hit_ratio": "draft hit ratio",
    "theoretical_speedup": "theor. speedup (×)",
    "latency_s": "latency (s/query)",
    "mt_bench_score": "MT-Bench score (GPT-4 judge)",
}
CATEGORY_KEY = "category"
DRAFTS_MEASURED = ("", "L-68M")
"""Drafts the stand-in scale measures: the stand-in's distilled draft stands in for LLaMA-68M (OPT-Tree's L-68M)."""
DEFAULT_DRAFT_LABEL = "L-68M"
"""The paper's name of a model config's draft when the config does not say (``draft.paper_label``): most model
configs run LLaMA-68M; vicuna_33b runs Vicuna-7B (V-7B) and llama2_70b(_chat) LLaMA-2-7B(-chat) (L-7B), as OPT-Tree did.
Rows with L-1B drafts are measured by llama2_{7b,13b}_chat_tinyllama, whose draft (TinyLlama-1.1B-Chat-v1.0) is a
labelled substitute for the unpublished LLaMA-2-1B; rows with EAGLE drafts are measured by the methods
whose config names that draft (``paper_draft``: eagle, eagle2, opt_tree_eagle)."""
GROUP_KEYS = [
    "paper",
    "table",
    "dataset",
    "paper_method",
    "method",
    "draft",
    "setting",
    "temperature",
    "metric",
    "measured_model",
]
"""Paper rows with equal keys are one measurement (at a stand-in scale: one per setting, over the paper models)."""
RANK_KEYS = ["paper", "table", "dataset", "temperature", "draft", "metric"]
"""Within a table, methods are ranked among the rows of the same dataset, temperature, draft and metric."""
SWEEP_KEYS = ["paper", "table", "paper_model", "dataset", "method", "draft", "temperature", "metric"]
"""Paper rows equal in these and differing in ``setting`` form a published sweep, shown relative to its default."""
DISPLAY_COLUMNS = ["dataset", "method", "setting", "metric", "paper values", "measured", "n", "notes"]
OVERVIEW_COLUMNS = ["paper", "dataset", "method", "setting", "metric", "paper values", "measured", "n"]
STATISTICS_DISPLAY = {
    "dataset": "dataset",
    "method": "method",
    "setting": "setting",
    "temperature": "T",
    "repeat": "repeat",
    "n_common": "n",
    "speedup": "speedup",
    "speedup_per_sample": "per sample",
    "speedup_mean": "mean rate",
    "speedup_ci": "95% CI",
    "exact_match_rate": "exact",
    "commit": "commit",
}
"""The statistics table as shown (column -> header); its CSV keeps every column at full precision."""
LATEX_WIDTHS = {
    "paper": 0.1,
    "dataset": 0.09,
    "method": 0.13,
    "setting": 0.12,
    "metric": 0.08,
    "paper values": 0.17,
    "measured": 0.13,
    "n": 0.05,
    "notes": 0.05,
    "T": 0.03,
    "repeat": 0.04,
    "speedup": 0.05,
    "per sample": 0.05,
    "mean rate": 0.05,
    "95% CI": 0.08,
    "exact": 0.05,
    "commit": 0.07,
}
"""Column widths in LaTeX as fractions of ``\\linewidth``: with 3 pt column separation every table fits the page."""
LATEX_BREAKS = "=,;/_"
"""Characters after which a LaTeX cell may break a line (settings and names have few spaces); see ``breaks_after``."""
SETTING_PREFIXES = ("method.drafter.", "method.acceptance_kwargs.", "method.")
CSV_COLUMNS = [
    *PAPER_COLUMNS,
    "group",
    "paper_rank",
    "measured",
    "measured_std",
    "speedup_ci",
    "n_samples",
    "repeats",
    "measured_model",
    "measured_rank",
    "relative_to_default",
    "commits",
    "refused",
    "runs",
]
STATISTICS_COLUMNS = [
    "model",
    "dataset",
    "method",
    "setting",
    "temperature",
    "repeat",
    "n_common",
    "speedup",
    "speedup_per_sample",
    "speedup_mean",
    "speedup_ci_low",
    "speedup_ci_high",
    "tokens_per_step",
    "throughput_total",
    "exact_match_rate",
    "env.git_commit",
    "pairing",
]


@dataclass(frozen=True)
class Built:
    """What one table or figure was built into, and from runs of which commits (with a warning on a mix); how many
    of its measurements the same-session rule refused (a table's ``—`` cells)."""

    paths: list[Path]
    commits: str
    warning: str | None
    refused: int = 0


# --- paper values and the runs that measure them ----------------------------------------------------


def paper_values() -> pd.DataFrame:
    """Every published number we reproduce, from the CSV files shipped in ``paper_values/``."""
    folder = resources.files("specbench.reproduce") / "paper_values"
    frames = [
        pd.read_csv(
            folder / name,
            dtype={"setting": str, "note": str},
            keep_default_na=False,
            na_values={"value": [""], "std": [""], "temperature": [""]},
        )
        for name in sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".csv"))
    ]
    values = pd.concat(frames, ignore_index=True)
    missing = set(PAPER_COLUMNS) - set(values.columns)
    if missing:
        raise ValueError(f"paper_values CSVs lack columns {sorted(missing)}")
    return values[PAPER_COLUMNS]


@cache
def model_draft(model: str) -> str:
    """The paper's name of the draft a model config runs: its ``draft.paper_label`` (L-68M when unset)."""
    path = find_config("model", model)
    label = OmegaConf.select(OmegaConf.load(path), "draft.paper_label") if path else None
    return label or DEFAULT_DRAFT_LABEL


@cache
def method_draft(method: str) -> str | None:
    """The paper's name of the draft a method brings itself, whatever the model's draft model is: its config's
    ``paper_draft`` (the EAGLE drafters run the model's EAGLE head), else None."""
    path = find_config("method", method) if method else None
    if path is None:
        return None
    draft = OmegaConf.select(OmegaConf.load(path), "paper_draft", default=None)
    return None if draft is None else str(draft)


def draft_measured(row: pd.Series, stand_in: str | None) -> bool:
    """Whether the runs of ``row``'s model use the row's draft: a method with its own draft (``method_draft``:
    EAGLE heads, the stand-in's trained head at a stand-in scale) measures that draft's rows only; otherwise at
    a stand-in scale the stand-in's draft stands in for ``DRAFTS_MEASURED`` only, and at paper scale the draft
    must be the one the row's model config runs (``model_draft``)."""
    own = method_draft(row["method"])
    if own:
        return row["draft"] == own
    if stand_in:
        return row["draft"] in DRAFTS_MEASURED
    return row["draft"] in ("", model_draft(row["model"]))


def parse_setting(text: str) -> dict:
    """``key=value;key=value`` -> {key: canonical value text} (YAML-parsed so 0.50 == 0.5, True == true)."""
    pairs = [item.split("=", 1) for item in text.split(";") if item.strip()]
    return {key.strip(): format_value(_yaml_value(value)) for key, value in pairs}


def _yaml_value(text: str):
    """A knob value as YAML reads it (lists as tuples, like the loader's flattened knobs)."""
    value = yaml.safe_load(text)
    return tuple(value) if isinstance(value, list) else value


def matching_runs(row: pd.Series, runs: pd.DataFrame, stand_in: str | None) -> pd.DataFrame:
    """The runs that measure one paper row: same model (or stand-in), dataset, method, T and knobs (none for a row
    that says why no job can measure it: a stand-in would otherwise fill rows of unnamed models)."""
    model = stand_in or row["model"]
    measurable = model and row["method"] and row["dataset"] and not str(row.get("unfillable") or "").strip()
    if not measurable or not draft_measured(row, stand_in):
        return runs.iloc[0:0]
    wanted = parse_setting(row["setting"])
    category = wanted.pop(CATEGORY_KEY, None)
    dataset = f"{row['dataset']}/{category}" if category else row["dataset"]
    same = runs[
        (runs["model"] == model)
        & (runs["dataset"] == dataset)
        & (runs["categories"] == "")  # a run kept to some categories (dataset.categories) measures no paper row
        & (runs["method"] == row["method"])
        & np.isclose(runs["temperature"], float(row["temperature"] or 0))
    ]
    return same[same["setting"] == setting_text(wanted)]  # both canonical: sorted keys, format_value values


def used_runs(metric: str, runs: pd.DataFrame) -> tuple[str, ...]:
    """The run folders a measured value rests on: its runs, and their AR runs for a paired metric."""
    folders = list(runs["run_dir"])
    if metric in PAIRED:
        folders += list(runs["ar_run_dir"].dropna())
    return tuple(sorted({folder.split("#", 1)[0] for folder in folders}))


def refusals(metric: str, runs: pd.DataFrame) -> str:
    """Why some of a paired metric's runs have no value: their pairing problems (``report.compare.pairing_problems``:
    AR partner timed in another session or machine), "" when none or for an unpaired metric."""
    if metric not in PAIRED or not len(runs):
        return ""
    return "; ".join(sorted(set(runs["pairing"].dropna()) - {""}))


ANPD_K = "drafter.draft_len"
"""ANPD's K, the drafted tokens per step (the method knob its theoretical speedup multiplies the hit ratio by)."""


def theoretical_speedup(runs: pd.DataFrame) -> pd.Series:
    """ANPD's theoretical speedup α·K + 1 of each run (its Fig 6 case study's "theoretical upper bound"): the run's
    measured draft hit ratio α (``draft_efficiency``, accepted over drafted tokens: the column the ``draft_hit_ratio``
    rows read) times its K (``drafter.draft_len``, its default when the run left it), plus the target's own token of
    each step; NaN for a run without K (a method other than ANPD) or without drafts."""
    k = pd.to_numeric(knob(runs, ANPD_K), errors="coerce")
    return runs["draft_efficiency"] * k + 1


DERIVED_METRICS = {"theoretical_speedup": theoretical_speedup}
"""Metrics no run stores, computed here and only here from each run's measured columns and knobs: metric -> the
function of the runs that gives its ``MEASURED_METRICS`` column."""


def with_derived(metric: str, runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with the column of ``metric`` when it is derived (``DERIVED_METRICS``), else unchanged."""
    derive = DERIVED_METRICS.get(metric)
    if derive is None or not len(runs):
        return runs
    return runs.assign(**{MEASURED_METRICS[metric]: derive(runs)})


def measure(row: pd.Series, runs: pd.DataFrame) -> dict:
    """Mean, std over repeats, sample count, (speedup) bootstrap interval of one row's metric, the run folders
    it rests on (``run_dirs``, AR runs included), the matched runs (``matched``, as the figures draw them) and why
    a paired metric's runs were refused (``refused``: their AR partner was timed in another session)."""
    column = MEASURED_METRICS.get(row["metric"])
    runs = with_derived(row["metric"], runs)
    values = runs[column].dropna() if column and len(runs) else pd.Series(dtype=float)
    refused = refusals(row["metric"], runs)
    if values.empty:
        return {
            "measured": np.nan,
            "measured_std": np.nan,
            "n_samples": 0,
            "repeats": 0,
            "speedup_ci": "",
            "run_dirs": used_runs("", runs) if refused else (),  # the refused runs, no partner: nothing is compared
            "matched": (),
            "refused": refused,
        }
    measured = runs.loc[values.index]
    interval = ""
    if row["metric"] == "speedup" and len(measured) == 1:
        interval = f"[{measured['speedup_ci_low'].iloc[0]:.2f}, {measured['speedup_ci_high'].iloc[0]:.2f}]"
    return {
        "measured": values.mean(),
        "measured_std": values.std() if len(values) > 1 else np.nan,
        "n_samples": int(measured["n_samples"].iloc[0]),
        "repeats": len(values),
        "speedup_ci": interval,
        "run_dirs": used_runs(row["metric"], measured),
        "matched": tuple(measured["run_dir"]),
        "refused": refused,
    }


def compare(values: pd.DataFrame, results: Results, by_category: Results, stand_in: str | None) -> pd.DataFrame:
    """The paper rows with the measured mean/std, sample and repeat counts, the model that was measured and the
    run folders used (no difference column: a paper's GPU number minus a stand-in's is meaningless)."""
    rows = []
    for _, row in values.iterrows():
        source = by_category if CATEGORY_KEY in parse_setting(row["setting"]) else results
        measured = measure(row, matching_runs(row, source.runs, stand_in))
        rows.append(
            {**row.to_dict(), **measured, "measured_model": (stand_in or row["model"]) if measured["repeats"] else ""}
        )
    return pd.DataFrame(rows)


# --- like with like: groups, ranks, sweeps ------------------------------------------------------------


def ranks(frame: pd.DataFrame, value: str, keys: list[str]) -> pd.Series:
    """Rank (1 = best) of ``value`` among the rows with equal ``keys``; NaN where a group has fewer than two values."""
    better_low = frame["metric"].isin(LOWER_IS_BETTER)
    score = frame[value].where(better_low, -frame[value])
    grouped = score.groupby([frame[key] for key in keys], dropna=False)
    rank = grouped.rank(method="min")
    return rank.where(grouped.transform("count") >= 2)


def relative_to_default(compared: pd.DataFrame) -> pd.Series:
    """A published sweep (rows equal in ``SWEEP_KEYS``, one with the default setting) relative to its default."""
    keys = [compared[key] for key in SWEEP_KEYS]
    default = compared["value"].where(compared["setting"] == "").groupby(keys, dropna=False).transform("max")
    sweeps = compared.groupby(keys, dropna=False)["setting"].transform("nunique") >= 2
    return (compared["value"] / default).where(sweeps)


def with_comparisons(compared: pd.DataFrame) -> pd.DataFrame:
    """The compared rows with ``group`` (one measurement), paper rank, measured rank and the sweep ratio."""
    frame = compared.reset_index(drop=True)
    group = frame.groupby(GROUP_KEYS, sort=False, dropna=False).ngroup()
    firsts = frame.assign(group=group).drop_duplicates("group")
    measured_rank = ranks(firsts, "measured", [*RANK_KEYS, "measured_model"])
    return frame.assign(
        group=group,
        paper_rank=ranks(frame, "value", [*RANK_KEYS, "paper_model"]),
        measured_rank=group.map(pd.Series(measured_rank.to_numpy(), index=firsts["group"])),
        relative_to_default=relative_to_default(frame),
    )


# --- display ------------------------------------------------------------------------------------------


def number(value: float, std: float = math.nan) -> str:
    """``12.34`` or ``12.34 ± 0.56`` (3 significant digits below 10); ``–`` when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    shown = f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return shown if std is None or math.isnan(std) else f"{shown} ± {std:.2g}"


def rank_text(rank: float) -> str:
    """`` #2`` for a ranked value, nothing otherwise."""
    return "" if rank is None or math.isnan(rank) else f" #{int(rank)}"


def ratio_text(ratio: float) -> str:
    """`` (0.91× default)`` for a sweep point, nothing otherwise."""
    return "" if ratio is None or math.isnan(ratio) else f" ({ratio:.2f}× default)"


def short_setting(setting: str, temperature: float) -> str:
    """Knobs without their config prefix (``window_size=10, guess_set_size=10``), and ``T = 1`` when sampled."""
    knobs = [f"{strip_prefix(key)}={value}" for key, value in parse_setting(str(setting)).items()]
    if temperature and not math.isnan(temperature):
        knobs.append(f"T = {temperature:g}")
    return ", ".join(knobs)


def strip_prefix(key: str) -> str:
    """A knob without the config prefix every knob shares (``method.drafter.warmup.dataset`` -> ``warmup.dataset``)."""
    prefix = next((prefix for prefix in SETTING_PREFIXES if key.startswith(prefix)), "")
    return key[len(prefix) :]


def paper_cell(rows: pd.DataFrame) -> str:
    """The paper's values of one measurement's rows: ``LLaMA-7B 2.31 #1; LLaMA-13B 2.28 #1``."""
    return "; ".join(
        f"{model or '?'} {number(value, std)}{rank_text(rank)}{ratio_text(ratio)}"
        for model, value, std, rank, ratio in zip(
            rows["paper_model"], rows["value"], rows["std"], rows["paper_rank"], rows["relative_to_default"]
        )
    )


def measured_cell(row: pd.Series) -> str:
    """One measurement: mean ± std over repeats, the bootstrap interval of a single run's speedup, the rank; ``—``
    for a paired metric whose every run was refused (its AR partner timed in another session: the note says why)."""
    if not row["repeats"]:
        return REFUSED if row["refused"] else "–"
    interval = f" {row['speedup_ci']}" if row["speedup_ci"] else ""
    return f"{number(row['measured'], row['measured_std'])}{interval}{rank_text(row['measured_rank'])}"


REFUSED = "—"
"""The cell of a speedup (or overhead) the rule refuses: no AR partner timed in the run's own session."""


def refusal_note(reason: str) -> str:
    """The note of a refused pairing: the reason, the rule and the way out."""
    return (
        f"speedups divide only times measured in one session (one process, one machine, one sitting): {reason}. A "
        f"cell shows {REFUSED} when none of its runs' sample pairs was timed together, else the speedup over those "
        "that were; to time every pair together, delete the experiment's folder (<results_root>/<experiment>) and "
        "rerun it (its session runs the AR partners beside the methods)"
    )


def note_numbers(frame: pd.DataFrame) -> tuple[pd.Series, list[str]]:
    """Per group, the numbers of its rows' notes, unfillable reasons and refused pairings; the distinct notes in
    order."""
    texts = [
        [text for text in (note, reason and f"not measurable: {reason}", refused and refusal_note(refused)) if text]
        for note, reason, refused in zip(frame["note"], frame["unfillable"], frame["refused"])
    ]
    notes = list(dict.fromkeys(text for row in texts for text in row))
    numbers = pd.Series([[notes.index(text) + 1 for text in row] for row in texts], index=frame.index)
    per_group = numbers.groupby(frame["group"], sort=False).agg(lambda lists: sorted({n for ns in lists for n in ns}))
    return per_group.map(lambda ns: ", ".join(map(str, ns))), notes


def display_frame(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One line per measurement (``DISPLAY_COLUMNS``, formatted) and the numbered notes."""
    notes_of, notes = note_numbers(frame)
    lines = []
    for group, rows in frame.groupby("group", sort=False):
        first = rows.iloc[0]
        method = f"{first['paper_method']} [{first['draft']}]" if first["draft"] else first["paper_method"]
        n = f"{int(first['n_samples'])} × {int(first['repeats'])}" if first["repeats"] else "–"
        lines.append(
            [
                first["dataset"] or "–",
                method,
                short_setting(first["setting"], first["temperature"]),
                METRIC_NAMES.get(first["metric"], first["metric"]),
                paper_cell(rows),
                measured_cell(first),
                n,
                notes_of[group],
            ]
        )
    return pd.DataFrame(lines, columns=DISPLAY_COLUMNS), notes


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table of a frame of strings/numbers (pipes escaped)."""
    cells = frame.astype(str).map(lambda text: text.replace("|", "\\|").replace("\n", " "))
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)]
    return "\n".join(lines) + "\n"


LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "×": r"$\times$",
    "–": "--",
    "—": "---",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "δ": r"$\delta$",
    "ε": r"$\epsilon$",
}


def breaks_after(text: str, index: int) -> bool:
    """Whether a LaTeX line may break after ``text[index]``: ``LATEX_BREAKS``, a dot before a letter, a hyphen
    inside a name (``Llama2-13b-chat``)."""
    char, before, after = text[index], text[index - 1 : index], text[index + 1 : index + 2]
    return (
        char in LATEX_BREAKS
        or (char == "." and after.isalpha())
        or (char == "-" and before.isalnum() and after.isalnum())
    )


def latex_text(text) -> str:
    """Text escaped for LaTeX, with a line-break opportunity after ``LATEX_BREAKS`` characters."""
    text = str(text)
    return "".join(
        LATEX_ESCAPES.get(char, char) + (r"\allowbreak{}" if breaks_after(text, index) else "")
        for index, char in enumerate(text)
    )


def to_latex(frame: pd.DataFrame, caption: str, notes_file: str | None) -> str:
    """A ``longtable`` (breaks across pages; needs ``\\usepackage{longtable}``) whose columns fit the line width."""
    spec = "".join(f"p{{{LATEX_WIDTHS[column]:g}\\linewidth}}" for column in frame.columns)
    head = " & ".join(rf"\textbf{{{latex_text(column)}}}" for column in frame.columns) + r" \\"
    body = [" & ".join(latex_text(cell) for cell in row) + r" \\" for row in frame.itertuples(index=False)]
    where = f" Notes: \\texttt{{{latex_text(notes_file)}}}." if notes_file else ""
    return "\n".join(
        [
            r"% needs \usepackage{longtable}",
            r"{\footnotesize\setlength{\tabcolsep}{3pt}",
            rf"\begin{{longtable}}{{{spec}}}",
            rf"\caption{{{latex_text(caption)}{where}}}\\",
            r"\hline",
            head,
            r"\hline",
            r"\endhead",
            *body,
            r"\hline",
            r"\end{longtable}}",
            "",
        ]
    )


def notes_latex(notes: list[str]) -> str:
    """The numbered notes of a table as a LaTeX list (``\\input`` it below the table)."""
    items = [rf"\item[{number}] {latex_text(note)}" for number, note in enumerate(notes, 1)]
    return "\n".join([r"\begin{description}\footnotesize", *items, r"\end{description}", ""]) if notes else ""


def notes_markdown(notes: list[str]) -> str:
    """The numbered notes under a Markdown table."""
    return "".join(f"{number}. {note}\n" for number, note in enumerate(notes, 1))


# --- files --------------------------------------------------------------------------------------------


def commits_of(runs: pd.DataFrame, folders) -> pd.DataFrame:
    """The whole runs (stamp and commit columns) among the given run folders."""
    return runs[runs["run_dir"].isin(set(folders))]


def preamble(title: str, used: pd.DataFrame, scale: str, stand_in: str | None) -> str:
    """The Markdown head of a table: what it is, where and by which commit(s) it was measured, the caveat."""
    lines = [f"# {title}", ""]
    if len(used):
        lines += [f"Measured on: {stamp(used)}; {commit_text(used)}.", ""]
        warning = provenance_warning(used)
        lines += [f"> **{warning}**", ""] if warning else []
    if stand_in:
        lines += [
            f"Scale `{scale}`: `{stand_in}` stands in for every paper model (one measurement per setting, beside "
            "the paper's values of every model it stands in for), with small sample limits: NOT the papers' "
            "setting. Tokens per step compare directly; throughput and speedup of other hardware do not, so "
            "compare the methods' ranks (#k: rank among this table's methods of the same dataset, temperature, "
            "draft and metric, per paper model and for the measured model; higher is better, lower for "
            "overhead and memory). A published sweep is shown relative to its default setting.",
            "",
        ]
    lines += [SESSION_NOTE, ""]
    lines += [
        "`n` = samples × repeats; `–` = not measured (a model, dataset or feature we do not have, or a run "
        "not in the results: see the notes).",
        "",
    ]
    return "\n".join(lines)


SESSION_NOTE = (
    "Speedups and overheads divide times measured in one session (one process, one machine, one sitting: each "
    "experiment times its AR partner beside its methods, prompts interleaved); a pair whose AR partner was timed in "
    f"another session or on another machine is refused ({REFUSED}, the note says why). Tokens per step and "
    "acceptance do not depend on the machine's speed: they compare across sessions, machines and commits."
)


def write_table(frame: pd.DataFrame, stem: Path, title: str, head: str, notes: list[str]) -> list[Path]:
    """``stem``.md (head, table, numbered notes), ``stem``.tex and ``stem``_notes.tex (when there are notes)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    markdown, latex = stem.with_suffix(".md"), stem.with_suffix(".tex")
    notes_path = stem.with_name(f"{stem.name}_notes.tex")
    markdown.write_text(head + "\n" + to_markdown(frame) + ("\nNotes:\n\n" + notes_markdown(notes) if notes else ""))
    latex.write_text(to_latex(frame, title, notes_path.name if notes else None))
    paths = [markdown, latex]
    if notes:
        notes_path.write_text(notes_latex(notes))
        paths.append(notes_path)
    else:
        notes_path.unlink(missing_ok=True)
    return paths


def paper_table(
    frame: pd.DataFrame, runs: pd.DataFrame, stem: Path, title: str, scale: str, stand_in: str | None, root: Path
) -> Built:
    """One paper table: Markdown and LaTeX (one line per measurement, numbered notes) and its CSV (per paper row,
    with the run folders each value rests on, AR partners included, relative to the results ``root``)."""
    used = commits_of(runs, {folder for folders in frame["run_dirs"] for folder in folders})
    shown, notes = display_frame(frame)
    paths = write_table(shown, stem, title, preamble(title, used, scale, stand_in), notes)
    csv = stem.with_suffix(".csv")
    frame.assign(
        commits=[
            " ".join(sorted(commits_of(runs, folders)["env.git_commit"].dropna().str[:7].unique()))
            for folders in frame["run_dirs"]
        ],
        runs=[" ".join(os.path.relpath(folder, root) for folder in folders) for folders in frame["run_dirs"]],
    )[CSV_COLUMNS].to_csv(csv, index=False)
    return Built(
        [*paths, csv],
        commit_text(used) if len(used) else "no runs",
        provenance_warning(used) if len(used) else None,
        int(frame.drop_duplicates("group").eval("repeats == 0 and refused != ''").sum()),
    )


def overview(compared: pd.DataFrame) -> pd.DataFrame:
    """One line per measurement over every table (refused speedups as ``—``): the paper's values of the rows it
    stands in for beside it."""
    lines = []
    for (paper, table), frame in compared.groupby(["paper", "table"], sort=False):
        shown, _ = display_frame(frame[(frame["repeats"] > 0) | (frame["refused"] != "")])
        lines += [[f"{paper} {table}", *row[:7]] for row in shown.itertuples(index=False)]
    return pd.DataFrame(lines, columns=OVERVIEW_COLUMNS)


def table_name(paper: str, table: str) -> str:
    """File stem of one paper table, e.g. ``opt_tree_table_1``."""
    return f"{paper}_{table.lower().replace(' ', '_')}"


def statistics(results: Results) -> pd.DataFrame:
    """Every non-AR run's speedup three ways (total/total, mean of per-sample ratios, ratio of mean rates)
    with its bootstrap interval and measuring commit, for readers who aggregate differently; a run with an AR
    partner timed in another session is listed without (``pairing`` says why)."""
    runs = results.runs[results.runs["method"] != "ar"]
    runs = runs[runs["speedup"].notna() | runs["ar_run_dir"].notna()]
    frame = runs[STATISTICS_COLUMNS].sort_values(["model", "dataset", "method", "setting", "temperature", "repeat"])
    return frame.assign(**{"env.git_commit": frame["env.git_commit"].str[:7]}).rename(
        columns={"env.git_commit": "commit"}
    )


def statistics_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The statistics as shown: short settings, 3 significant digits, the interval as ``[low, high]``."""
    shown = frame.assign(
        setting=[short_setting(setting, 0) for setting in frame["setting"]],
        speedup_ci=[f"[{low:.2f}, {high:.2f}]" for low, high in zip(frame["speedup_ci_low"], frame["speedup_ci_high"])],
    )
    for column in ("speedup", "speedup_per_sample", "speedup_mean", "exact_match_rate"):
        shown[column] = shown[column].map(number)
    refused = frame["speedup"].isna().to_numpy()
    shown.loc[refused, ["speedup", "speedup_per_sample", "speedup_mean", "speedup_ci"]] = REFUSED
    return shown[list(STATISTICS_DISPLAY)].rename(columns=STATISTICS_DISPLAY)


def simple_table(
    frame: pd.DataFrame, shown: pd.DataFrame, stem: Path, title: str, head: str, used: pd.DataFrame
) -> Built:
    """A table without paper values (overview, statistics): Markdown and LaTeX as ``shown``, the CSV in full."""
    paths = write_table(shown.fillna("–"), stem, title, head, [])
    frame.to_csv(stem.with_suffix(".csv"), index=False)
    return Built([*paths, stem.with_suffix(".csv")], commit_text(used), provenance_warning(used))


STATISTICS_NOTE = (
    "`speedup` = total tokens / total time over the AR run's; `per sample` = mean of per-sample ratios; "
    "`mean rate` = mean rate / mean AR rate (Spec-Bench); `95% CI` = bootstrap interval of `speedup` "
    "over the paired samples (`specbench.report.compare.speedup_statistics`); `n` = paired samples; `exact` = "
    "share of samples equal to AR's output; `—` = refused: no sample of the run was timed in one session with its AR "
    "partner's (the CSV's `pairing` says why). The CSV has every column at full precision.\n"
)


def paper_comparison(results: Results, by_category: Results, stand_in: str | None) -> pd.DataFrame:
    """Every paper row beside its measurement, grouped and ranked (``compare`` + ``with_comparisons``): what the
    tables show and what the figures mark."""
    return with_comparisons(compare(paper_values(), results, by_category, stand_in))


def build_tables(
    compared: pd.DataFrame, results: Results, out_dir: Path, scale: str, stand_in: str | None, root: Path
) -> dict[str, Built]:
    """One table per paper table, the overview and the speedup statistics; {name: Built} (``root``: the results
    folder the CSVs name run folders relative to)."""
    runs = results.every_run
    built = {}
    for (paper, table), frame in compared.groupby(["paper", "table"], sort=False):
        title = f"{paper} {table}: paper vs measured"
        built[table_name(paper, table)] = paper_table(
            frame, runs, out_dir / table_name(paper, table), title, scale, stand_in, root
        )
    used = commits_of(runs, {folder for folders in compared["run_dirs"] for folder in folders})
    title = "Overview: each measurement beside the paper values it stands in for"
    lines = overview(compared)
    built["overview"] = simple_table(
        lines, lines, out_dir / "overview", title, preamble(title, used, scale, stand_in), used
    )
    title = "Speedup of every run: total/total, mean of per-sample ratios, ratio of mean rates (Spec-Bench)"
    paired = results.runs[results.runs["method"] != "ar"].dropna(subset=["speedup"])
    used = commits_of(runs, {*paired["run_dir"], *paired["ar_run_dir"]})
    frame = statistics(results)
    built["speedup_statistics"] = simple_table(
        frame,
        statistics_display(frame),
        out_dir / "speedup_statistics",
        title,
        preamble(title, used, scale, stand_in) + STATISTICS_NOTE,
        used,
    )
    return built
