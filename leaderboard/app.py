"""The bench leaderboard: `bench leaderboard [--db URL] [--port N]` or
`streamlit run leaderboard/app.py -- --db URL`. Read-only over the store."""

from pathlib import Path

import streamlit as st

st.set_page_config(page_title="bench leaderboard", page_icon=":material/leaderboard:", layout="wide")
HERE = Path(__file__).parent / "pages"
pages = [
    st.Page(HERE / "leaderboard.py", title="Leaderboard", icon=":material/leaderboard:", default=True),
    st.Page(HERE / "grid.py", title="Precision grid", icon=":material/grid_on:"),
    st.Page(HERE / "staleness.py", title="Staleness", icon=":material/history:"),
    st.Page(HERE / "corrections.py", title="Corrections", icon=":material/healing:"),
    st.Page(HERE / "tolerance.py", title="Tolerance", icon=":material/stairs:"),
    st.Page(HERE / "run.py", title="Run", icon=":material/show_chart:"),
    st.Page(HERE / "compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page(HERE / "builds.py", title="Builds", icon=":material/dataset:"),
    st.Page(HERE / "mismatch.py", title="Mismatch", icon=":material/troubleshoot:"),
]
st.navigation(pages).run()
