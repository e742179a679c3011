"""Draw bench/scale.sh's cost curves as SVG: scale_plot.py OUT_DIR SVG_DIR.

Reads OUT_DIR/{catalog,documents,tenants,clients}.tsv (a header line, tab-separated; written by
bench/scale.sh) and writes SVG_DIR/<name>.svg for each file present. Text stays text in the SVG
and no date or random id is written into it, so charts of the same figures are the same bytes.
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

plt.rcParams.update({
    "svg.hashsalt": "ctxguard-scale",
    "svg.fonttype": "none",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
})
FIXED, SCALE = "C0", "C1"
AIM = dict(color="#b22222", linestyle="--", linewidth=1)


def rows(out, name):
    path = os.path.join(out, f"{name}.tsv")
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        data = list(csv.DictReader(f, delimiter="\t"))
    return data or None


def col(data, key, conv=float):
    return [conv(r[key]) for r in data]


def thousands(x, _pos):
    return f"{x / 1000:g}k" if x >= 1000 else f"{x:g}"


def log_x(ax, xs, label):
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.xaxis.set_major_formatter(FuncFormatter(thousands))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    ax.set_xlabel(label)


def log_y(ax):
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    lo, hi = ax.get_ylim()
    # Minor ticks 2 and 5 of each decade labelled, on a range of up to three decades.
    some = FuncFormatter(lambda v, _pos: f"{v:g}" if f"{v:g}"[0] in "25" else "")
    ax.yaxis.set_minor_formatter(some if hi / lo < 1000 else FuncFormatter(lambda *_: ""))


def save(fig, svg_dir, name, title):
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(svg_dir, f"{name}.svg"), metadata={"Date": None})
    plt.close(fig)


def catalog(data, svg_dir):
    xs = col(data, "scale_tools")
    fig, ax = plt.subplots(2, 2, figsize=(10, 7))
    a = ax[0][0]
    a.plot(xs, col(data, "register_ms_per_tool"), "o-", label="mean over the step's statements")
    a.plot(xs, col(data, "last_stmt_ms_per_tool"), "s--", label="last statement of the step")
    a.set_ylabel("ms per tool")
    a.set_title("register_tool, 1,000 per statement")
    a.set_ylim(bottom=0)
    a.legend()
    a = ax[0][1]
    a.plot(xs, col(data, "fresh_fixed_ms"), "o-", color=FIXED, label="fresh backend, invoice_detail")
    a.plot(xs, col(data, "fresh_scale_ms"), "o-", color=SCALE, label="fresh backend, scale_p042")
    a.plot(xs, col(data, "change_fixed_ms"), "s--", color=FIXED, label="after a change, invoice_detail")
    a.plot(xs, col(data, "change_scale_ms"), "s--", color=SCALE, label="after a change, scale_p042")
    a.plot(xs, col(data, "warm_fixed_ms"), "^:", color=FIXED, label="warm, invoice_detail")
    a.plot(xs, col(data, "warm_scale_ms"), "^:", color=SCALE, label="warm, scale_p042")
    a.axhline(5, **AIM, label="aim after a change: 5 ms")
    a.set_ylabel("ms, median of the calls")
    a.set_title("BEGIN; set_context; visible_tools; COMMIT")
    a.set_ylim(bottom=0)
    a.legend()
    a = ax[1][0]
    a.plot(xs, col(data, "gate_fixed_ms"), "o-", color=FIXED, label="avg, invoice_detail")
    a.plot(xs, col(data, "gate_fixed_p95"), "o:", color=FIXED, label="p95, invoice_detail")
    a.plot(xs, col(data, "gate_scale_ms"), "s-", color=SCALE, label="avg, scale_p042")
    a.plot(xs, col(data, "gate_scale_p95"), "s:", color=SCALE, label="p95, scale_p042")
    a.set_ylabel("ms per transaction (pgbench, 1 client)")
    a.set_title("Warm context + Gate A")
    a.set_ylim(bottom=0)
    a.legend()
    a = ax[1][1]
    mb = 1024 * 1024
    a.plot(xs, [v / mb for v in col(data, "kept_bytes")], "o-", label="kept after two pages (bytes_kept)")
    a.plot(xs, [v / mb for v in col(data, "sweep_kept_bytes")], "s-", label="kept after every page type (bytes_kept)")
    a.plot(xs, [(b - a_) / 1024 for a_, b in zip(col(data, "sweep_private_before_kb"), col(data, "sweep_private_after_kb"))],
           "^--", label="private memory growth, every page type")
    a.plot(xs, [v / mb for v in col(data, "kept_limit")], color="grey", linewidth=1, label="catalog_cache_size")
    a.axhline(16, **AIM, label="aim: 16 MB")
    a.set_ylabel("MB")
    a.set_title("Backend memory for the catalog")
    a.set_ylim(bottom=0)
    a.legend()
    for a in ax.flat:
        log_x(a, xs, "scale tools in the catalog")
    save(fig, svg_dir, "catalog", "Catalog size")


def documents(data, svg_dir):
    xs = col(data, "pages")
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    for a, key, title in ((ax[0], "read", "read_doc_pages, 5 pages"), (ax[1], "search", "doc_local_search, 4 queries")):
        a.plot(xs, col(data, f"{key}_p50"), "o-", label="p50")
        a.plot(xs, col(data, f"{key}_p95"), "s--", label="p95")
        log_y(a)
        a.set_ylabel("ms per call, in the database (1 client)")
        a.set_title(title)
        log_x(a, xs, "pages in the document")
        a.legend()
    save(fig, svg_dir, "documents", "Document size")


def tenants(data, svg_dir):
    xs = col(data, "tenants")
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    a = ax[0]
    for c, m, colour in (("1", "o", "C0"), ("4", "s", "C1")):
        who = "1 client" if c == "1" else f"{c} clients"
        a.plot(xs, col(data, f"ms_c{c}"), m + "-", color=colour, label=f"avg, {who}")
        a.plot(xs, col(data, f"p95_c{c}"), m + ":", color=colour, label=f"p95, {who}")
    a.set_ylabel("ms per transaction")
    a.set_title("set_context + visible_tools + call_tool, random tenant")
    a.set_ylim(bottom=0)
    a.legend()
    a = ax[1]
    a.plot(xs, col(data, "user_days_live"), "o-", label="user-day entries live")
    a.plot(xs, col(data, "user_days_slots"), color="grey", linewidth=1, label="slots")
    log_y(a)
    a.set_ylabel("entries")
    a.set_title(f"Ledger (shared memory {data[-1]['ledger_mb']} MB, fixed)")
    a.legend()
    for a in ax:
        log_x(a, xs, "tenants")
    save(fig, svg_dir, "tenants", "Tenants")


def clients(data, svg_dir):
    xs = col(data, "clients")
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    a = ax[0]
    a.plot(xs, col(data, "base_tps"), "o-", label="careful baseline")
    a.plot(xs, col(data, "ctx_tps"), "s-", label="ctxguard")
    a.set_ylabel("transactions per second")
    a.set_title("Through pgbouncer (transaction mode)")
    a.set_ylim(bottom=0)
    a.legend()
    a = ax[1]
    a.plot(xs, col(data, "ratio"), "o-", label="a round trip per statement")
    a.fill_between(xs, col(data, "ratio_min"), col(data, "ratio_max"), alpha=0.25)
    a.plot(xs, col(data, "pratio"), "s-", label="pipelined, as the gateway sends it")
    a.fill_between(xs, col(data, "pratio_min"), col(data, "pratio_max"), alpha=0.25)
    a.legend()
    a.set_ylabel("ctxguard tps / careful baseline tps")
    a.set_title("Ratio: median (and range) of rounds of adjacent runs")
    a.set_ylim(0, max(1.2, max(col(data, "ratio_max") + col(data, "pratio_max")) * 1.1))
    a.axhline(1, color="grey", linewidth=1)
    for a in ax:
        log_x(a, xs, "pgbench clients")
    save(fig, svg_dir, "clients", "Clients")


def main():
    out, svg_dir = sys.argv[1], sys.argv[2]
    os.makedirs(svg_dir, exist_ok=True)
    for name, draw in (("catalog", catalog), ("documents", documents), ("tenants", tenants), ("clients", clients)):
        data = rows(out, name)
        if data:
            draw(data, svg_dir)


if __name__ == "__main__":
    main()
