"""Per build: the accuracy histogram with the band, bucket counts, sampling, speed, and the problems."""

import altair as alt
import pandas as pd
import streamlit as st

from leaderboard import data, display

st.title("Builds")
url = data.store_url()
builds = data.builds(url)
if builds.empty:
    st.info("No builds yet. Make one with `bench build --model tiny-math`.")
    st.stop()
label = {b.build: f"{b.build} · {b.model} · {b.status} · {b.n_kept}/{b.n_problems} kept" for b in builds.itertuples()}
build_id = st.selectbox("Build", list(builds.build), format_func=label.get)
b = builds.set_index("build").loc[build_id]
m = b.manifest or {}
counts = m.get("counts", {})
c = st.columns(5)
for col, key in zip(c, ("kept", "too_easy", "too_hard", "bad_gold")):
    col.metric(key.replace("_", " "), counts.get(key, 0))
c[4].metric("rollouts/s", "—" if not m.get("rollouts_per_s") else f"{m['rollouts_per_s']:.0f}")
st.caption(f"model {b.model} · engine {b.engine} · dtype {b['dtype']} · k={b.k} · band [{b.lo}, {b.hi}] (inclusive) · "
           f"sampling {m.get('sampling')} · wall {m.get('wall_s', 0):.0f}s")
dup = m.get("duplicates") or {}
st.caption(f"split hash `{b.split_hash or '—'}` (sha256 of the kept [[id, gold], …] sorted by id: runs on one hash "
           "are comparable across stores)" + (f" · the source repeats {dup['repeated']} problem(s) "
                                              f"({dup['extra_rows']} extra rows of {dup['rows']}), each counted once"
                                              if dup.get("repeated") else ""))

probs = data.build_problems(url, build_id)
if not probs.empty:
    hist = probs.dropna(subset=["accuracy"])
    bars = alt.Chart(hist).mark_bar().encode(
        x=alt.X("accuracy:Q", bin=alt.Bin(step=1 / max(1, int(b.k))), title="per-problem accuracy"),
        y=alt.Y("count():Q", title="problems"), color="bucket:N")
    band = alt.Chart(pd.DataFrame({"x": [b.lo], "x2": [b.hi]})).mark_rect(opacity=0.12, color="green").encode(
        x="x:Q", x2="x2:Q")
    st.altair_chart(band + bars, width="stretch")
    bucket = st.multiselect("Buckets", sorted(probs.bucket.unique()),
                            default=["kept"] if "kept" in set(probs.bucket) else None)
    text = st.text_input("Search problems")
    view = probs if not bucket else probs[probs.bucket.isin(bucket)]
    if text:
        view = view[view.problem.str.contains(text, case=False, regex=False)]
    display.dataframe(view, hide_index=True, width="stretch",
                      column_config={"accuracy": st.column_config.ProgressColumn("accuracy", min_value=0, max_value=1)})
with st.expander("Manifest"):
    st.json(m)
