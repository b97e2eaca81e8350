"""The pages' choice of one rollout engine and one settings fingerprint (leaderboard/cells.py's
cell key), for pages that lay cells out on other axes (the precision grid, staleness × precision):
a grid square is one cell only when every run in the view shares the engine and the settings."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from leaderboard.cells import fingerprint_configs, settings_label, settings_spread, with_cell_key


def engine_and_settings(view: pd.DataFrame, columns=None) -> pd.DataFrame:
    """`view` (runs) narrowed to one engine and one settings fingerprint, each a selectbox when
    the view has more than one (the settings labelled by what differs); the newest run's choice
    first. `columns`: two Streamlit containers for the boxes (default: the page)."""
    view = with_cell_key(view)
    if view.empty:
        return view
    left, right = columns or (st, st)
    newest = view.sort_values("created_at", ascending=False, kind="stable") if "created_at" in view else view
    engines = list(dict.fromkeys(newest.engine))
    if len(engines) > 1:
        engine = left.selectbox("Rollout engine", engines, help="Runs of another engine are other cells")
        view, newest = view[view.engine == engine], newest[newest.engine == engine]
    fps = list(dict.fromkeys(newest.config_fp))
    if len(fps) > 1:
        spread = settings_spread({fp: c for fp, c in fingerprint_configs(view).items()})
        fp = right.selectbox("Settings", fps, format_func=lambda f: settings_label(f, spread),
                             help="Runs that differ in any setting but the seed are other cells (the Compare "
                                  "page shows every difference)")
        view = view[view.config_fp == fp]
    return view
