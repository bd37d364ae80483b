"""``python -m specbench``: the Hydra app that runs one model x method x dataset benchmark."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from specbench.cli import interrupted, run_hydra_app, user_errors
from specbench.config import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    """Run the configured benchmark and print its results table."""
    from specbench.report.view import format_table, table
    from specbench.runner import Runner

    with user_errors():
        try:
            out_dir = Runner(cfg).run()
        except KeyboardInterrupt as stop:
            interrupted(stop, f"finished samples are saved in {cfg.output_dir}; rerun the same command to resume")
    print(f"\nresults: {out_dir}")
    print(format_table(table([out_dir])))


if __name__ == "__main__":
    run_hydra_app(main, "config")
