"""``python -m specbench``: the Hydra app that runs one model x method x dataset benchmark."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from specbench.config import CONF_DIR
from specbench.errors import UserError


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    """Run the configured benchmark and print its results table."""
    from specbench.report import format_table, table
    from specbench.runner import Runner

    try:
        out_dir = Runner(cfg).run()
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: finished samples are saved in {cfg.output_dir}; rerun the same command to resume",
            file=sys.stderr,
        )
        sys.exit(130)
    print(f"\nresults: {out_dir}")
    print(format_table(table([out_dir])))


if __name__ == "__main__":
    main()
