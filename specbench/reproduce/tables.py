"""Paper-vs-measured tables: each published number (``paper_values/*.csv``) beside the number measured
in the stored runs of the same setting, with the difference, sample counts, repeats and the stamp.

A paper row names our model, dataset, method config, the knobs it changes from the method's
defaults (``setting``) and the temperature; the measured value comes from the runs that match all of
them (at smoke scale the plan's stand-in model replaces the paper's). Repeats give mean and std;
speedups come from pairing each run with its AR run (report.match_ar) and carry a bootstrap interval.
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from omegaconf import OmegaConf

from specbench.config import CONF_DIR
from specbench.reproduce.results import Results, format_value, setting_text, stamp

PAPER_COLUMNS = ["paper", "table", "paper_model", "model", "draft", "dataset", "paper_method", "method",
                 "setting", "temperature", "metric", "value", "std", "note", "unfillable"]
MEASURED_METRICS = {"throughput": "throughput_total", "speedup": "speedup", "tokens_per_step": "tokens_per_step",
                    "overhead": "overhead", "peak_memory_gib": "peak_memory_gib",
                    "draft_hit_ratio": "draft_efficiency"}
CATEGORY_KEY = "category"
DRAFTS_MEASURED = ("", "L-68M")
"""Drafts the stand-in scale measures: the stand-in's distilled draft stands in for LLaMA-68M (OPT-Tree's L-68M)."""
DEFAULT_DRAFT_LABEL = "L-68M"
"""The paper's name of a model config's draft when the config does not say (``draft.paper_label``): most model
configs run LLaMA-68M; vicuna_33b runs Vicuna-7B (V-7B) and llama2_70b LLaMA-2-7B (L-7B), as OPT-Tree did.
Rows with L-1B or EAGLE drafts are never measured (no such model / not implemented)."""
TABLE_COLUMNS = ["paper_model", "draft", "dataset", "paper_method", "setting", "temperature", "metric", "paper",
                 "measured", "difference", "n_samples", "repeats", "speedup_ci", "measured_model", "note"]
STATISTICS_COLUMNS = ["model", "dataset", "method", "setting", "temperature", "repeat", "n_common", "speedup",
                      "speedup_per_sample", "speedup_mean", "speedup_ci_low", "speedup_ci_high", "tokens_per_step",
                      "throughput_total", "exact_match_rate"]


def paper_values() -> pd.DataFrame:
    """Every published number we reproduce, from the CSV files shipped in ``paper_values/``."""
    folder = resources.files("specbench.reproduce") / "paper_values"
    frames = [pd.read_csv(folder / name, dtype={"setting": str, "note": str}, keep_default_na=False,
                          na_values={"value": [""], "std": [""], "temperature": [""]})
              for name in sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".csv"))]
    values = pd.concat(frames, ignore_index=True)
    missing = set(PAPER_COLUMNS) - set(values.columns)
    if missing:
        raise ValueError(f"paper_values CSVs lack columns {sorted(missing)}")
    return values[PAPER_COLUMNS]


@cache
def model_draft(model: str) -> str:
    """The paper's name of the draft a model config runs: its ``draft.paper_label`` (L-68M when unset)."""
    path = CONF_DIR / "model" / f"{model}.yaml"
    draft = OmegaConf.load(path).get("draft") if path.is_file() else None
    return (draft or {}).get("paper_label") or DEFAULT_DRAFT_LABEL


def draft_measured(row: pd.Series, stand_in: str | None) -> bool:
    """Whether the runs of ``row``'s model use the row's draft: at a stand-in scale the stand-in's draft
    stands in for ``DRAFTS_MEASURED`` only; at paper scale the draft must be the one the row's model config
    runs (``model_draft``)."""
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
    """The runs that measure one paper row: same model (or stand-in), dataset, method, T and knobs."""
    model = stand_in or row["model"]
    if not (model and row["method"] and row["dataset"]) or not draft_measured(row, stand_in):
        return runs.iloc[0:0]
    wanted = parse_setting(row["setting"])
    category = wanted.pop(CATEGORY_KEY, None)
    dataset = f"{row['dataset']}/{category}" if category else row["dataset"]
    same = runs[(runs["model"] == model) & (runs["dataset"] == dataset) & (runs["method"] == row["method"])
                & np.isclose(runs["temperature"], float(row["temperature"] or 0))]
    return same[same["setting"] == setting_text(wanted)]  # both canonical: sorted keys, format_value values


def measure(row: pd.Series, runs: pd.DataFrame) -> dict:
    """Mean, std over repeats, sample count and (speedup) bootstrap interval of one row's metric."""
    column = MEASURED_METRICS.get(row["metric"])
    values = runs[column].dropna() if column and len(runs) else pd.Series(dtype=float)
    if values.empty:
        return {"measured": np.nan, "measured_std": np.nan, "n_samples": 0, "repeats": 0, "speedup_ci": ""}
    interval = ""
    if row["metric"] == "speedup" and len(runs) == 1:
        interval = f"[{runs['speedup_ci_low'].iloc[0]:.2f}, {runs['speedup_ci_high'].iloc[0]:.2f}]"
    return {"measured": values.mean(), "measured_std": values.std() if len(values) > 1 else np.nan,
            "n_samples": int(runs["n_samples"].iloc[0]), "repeats": len(values), "speedup_ci": interval}


def compare(values: pd.DataFrame, results: Results, by_category: Results, stand_in: str | None) -> pd.DataFrame:
    """The paper rows with measured mean/std, difference, counts and the model that was measured."""
    rows = []
    for _, row in values.iterrows():
        source = by_category if CATEGORY_KEY in parse_setting(row["setting"]) else results
        runs = matching_runs(row, source.runs, stand_in)
        measured = measure(row, runs)
        rows.append({**row.to_dict(), **measured, "difference": measured["measured"] - row["value"],
                     "measured_model": (stand_in or row["model"]) if measured["repeats"] else ""})
    return pd.DataFrame(rows)


def _with_std(value: float, std: float) -> str:
    """``12.34`` or ``12.34 ± 0.56``; ``–`` when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.2f}" if std is None or math.isnan(std) else f"{value:.2f} ± {std:.2f}"


def display_frame(compared: pd.DataFrame) -> pd.DataFrame:
    """The columns a reader sees, numbers formatted (paper and measured with their std)."""
    shown = compared.assign(paper=[_with_std(v, s) for v, s in zip(compared["value"], compared["std"])],
                            measured=[_with_std(v, s) for v, s in
                                      zip(compared["measured"], compared["measured_std"])],
                            difference=[_with_std(d, np.nan) for d in compared["difference"]],
                            temperature=compared["temperature"].map("{:g}".format))
    return shown[TABLE_COLUMNS]


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table of a frame of strings/numbers (pipes escaped)."""
    cells = frame.astype(str).map(lambda text: text.replace("|", "\\|").replace("\n", " "))
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)]
    return "\n".join(lines) + "\n"


LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$"}


def to_latex(frame: pd.DataFrame, caption: str) -> str:
    """A LaTeX ``table`` with a ``tabular`` of the frame, special characters escaped."""
    def escape(text) -> str:
        return "".join(LATEX_ESCAPES.get(char, char) for char in str(text))

    body = [" & ".join(escape(cell) for cell in row) + r" \\" for row in frame.itertuples(index=False)]
    return "\n".join([r"\begin{table}[ht]", r"\centering", r"\small",
                      r"\begin{tabular}{" + "l" * len(frame.columns) + "}", r"\hline",
                      " & ".join(escape(column) for column in frame.columns) + r" \\", r"\hline", *body,
                      r"\hline", r"\end{tabular}", r"\caption{" + escape(caption) + "}", r"\end{table}", ""])


def header(title: str, results: Results, scale: str, stand_in: str | None) -> str:
    """The Markdown preamble of a table: what it is, where measured, and the scale caveat."""
    lines = [f"# {title}", "", f"Measured on: {stamp(results.runs)}", ""]
    if stand_in:
        lines += [f"Scale `{scale}`: every paper model is replaced by `{stand_in}` with small sample limits, so "
                  f"the measured column shows this harness's behaviour on this machine, NOT the papers' setting. "
                  f"`–` = not measured (a model, dataset or feature we do not have, or a run not in the results).", ""]
    return "\n".join(lines)


def write_table(frame: pd.DataFrame, stem: Path, title: str, preamble: str) -> list[Path]:
    """``stem``.md (preamble + table), .tex and .csv (full precision); the written paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    shown = display_frame(frame) if "value" in frame else frame.round(3)
    paths = [stem.with_suffix(".md"), stem.with_suffix(".tex"), stem.with_suffix(".csv")]
    paths[0].write_text(preamble + "\n" + to_markdown(shown.fillna("–")))
    paths[1].write_text(to_latex(shown.fillna("–"), title))
    frame.to_csv(paths[2], index=False)
    return paths


OVERVIEW_KEYS = ["paper", "table", "dataset", "paper_method", "setting", "temperature", "metric", "measured_model"]


def overview(compared: pd.DataFrame) -> pd.DataFrame:
    """One line per measured setting: the paper's values over its models beside the measured value (the
    compact view for a stand-in scale, where several paper models share one measurement)."""
    measured = compared[compared["repeats"] > 0]
    grouped = measured.groupby(OVERVIEW_KEYS, sort=False, dropna=False)
    return pd.DataFrame({
        "paper models": grouped["paper_model"].agg(lambda names: ", ".join(dict.fromkeys(n for n in names if n))),
        "paper values": grouped["value"].agg(lambda values: " / ".join(f"{v:g}" for v in values)),
        "measured": grouped.apply(lambda rows: _with_std(rows["measured"].iloc[0], rows["measured_std"].iloc[0]),
                                  include_groups=False),
        "n_samples": grouped["n_samples"].first(), "repeats": grouped["repeats"].first(),
    }).reset_index()


def table_name(paper: str, table: str) -> str:
    """File stem of one paper table, e.g. ``opt_tree_table_1``."""
    return f"{paper}_{table.lower().replace(' ', '_')}"


def statistics(results: Results) -> pd.DataFrame:
    """Every non-AR run's speedup three ways (total/total, mean of per-sample ratios, ratio of mean rates)
    with its bootstrap interval, for readers who aggregate differently."""
    runs = results.runs[results.runs["method"] != "ar"].dropna(subset=["speedup"])
    return runs[STATISTICS_COLUMNS].sort_values(["model", "dataset", "method", "setting", "temperature", "repeat"])


def build_tables(results: Results, by_category: Results, out_dir: Path, scale: str,
                 stand_in: str | None) -> dict[str, list[Path]]:
    """One Markdown/LaTeX/CSV table per paper table, the speedup statistics table; {name: paths}."""
    compared = compare(paper_values(), results, by_category, stand_in)
    written = {}
    for (paper, table), frame in compared.groupby(["paper", "table"], sort=False):
        title = f"{paper} {table}: paper vs measured"
        written[table_name(paper, table)] = write_table(frame, out_dir / table_name(paper, table), title,
                                                        header(title, results, scale, stand_in))
    title = "Overview: each measured setting, the papers' values beside the measured one"
    written["overview"] = write_table(overview(compared), out_dir / "overview", title,
                                      header(title, results, scale, stand_in))
    title = "Speedup of every run: total/total, mean of per-sample ratios, ratio of mean rates (Spec-Bench)"
    preamble = header(title, results, scale, stand_in) + (
        "\n`speedup` = total tokens / total time over the AR run's; `speedup_per_sample` = mean of per-sample "
        "ratios; `speedup_mean` = mean rate / mean AR rate (Spec-Bench); CI = 95 % bootstrap of `speedup` "
        "over samples.\n")
    written["speedup_statistics"] = write_table(statistics(results), out_dir / "speedup_statistics", title, preamble)
    return written
