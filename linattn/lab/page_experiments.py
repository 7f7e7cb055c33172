"""The performance page's sections for the paper's experiments: the copy task, the image
table, the synthetic speech task and associative retrieval, each read from its CSV."""
from .page_format import _csv, _missing, _pivot, _sig, _source, _table


def _copy_task(figures_dir):
    path = figures_dir / "copy_task_loss.csv"
    rows, meta = _csv(path)
    if rows is None:
        return _missing("Copy task", path)
    body = []
    for name, by_step in _pivot(rows, "eval_loss", "step").items():
        last = max(by_step)
        body.append([name, last, _sig(by_step[last])])
    return (f"## Copy task ({_source(path, meta)})\n\nHeld-out loss, nats per "
            "copied symbol, at the last evaluation of each attention's run (the paper's "
            "figure 2, smaller). The figure: `figures/copy_task_loss.png`."
            + _sentence(meta.get("caption")) + "\n\n"
            + _table(["attention", "step", "held-out loss"], body))


def _images(figures_dir):
    """Table 1 of the paper tier (``image_table.csv``); nothing when it has not run."""
    path = figures_dir / "image_table.csv"
    rows, meta = _csv(path)
    if rows is None:
        return ""
    body = [[r["name"], _sig(r["bits_per_dim"]), r["form"], r["batch"],
             _sig(r["images_per_s"]) + ("" if r["measured"] in (True, "True") else " (est.)")]
            for r in rows]
    return (f"## Images, the paper's Table 1 ({_source(path, meta)})\n\nBits per dimension "
            "on the held-out images and images per second generating with each attention's "
            "fastest form, from `make paper`. The figure: `figures/image_table.png`."
            + _sentence(meta.get("caption")) + "\n\n"
            + _table(["attention", "bits/dim", "form", "batch", "images/s"], body,
                     ["---", "---:", "---", "---:", "---:"]))


def _sentence(text):
    """" " and ``text`` as a sentence, its first letter capitalised; "" for None."""
    return f" {text[0].upper()}{text[1:]}." if text else ""


def _speech(figures_dir):
    path = figures_dir / "speech_table.csv"
    rows, meta = _csv(path)
    if rows is None:
        return _missing("Speech (synthetic)", path)
    body = [[r["model"], r["n_params"], r["epochs"], _sig(r["test_per"]),
             _sig(r.get("s_per_epoch"))] for r in rows]
    return (f"## Speech, synthetic task ({_source(path, meta)})\n\nThe paper's "
            "Table 3 on a synthetic phoneme task (not WSJ; see `docs/speech.md`): test phoneme "
            "error rate and the median seconds per training epoch; the last rows are trivial "
            "outputs, for scale." + _sentence(meta.get("caption"))
            + _sentence(meta.get("attention")) + "\n\n"
            + _table(["model", "parameters", "epochs", "test PER", "s / epoch"], body,
                     ["---", "---:", "---:", "---:", "---:"]))


def _retrieval(figures_dir):
    path = figures_dir / "retrieval_capacity.csv"
    rows, meta = _csv(path)
    if rows is None:
        return _missing("Associative retrieval", path)
    names = list(dict.fromkeys(r["name"] for r in rows))
    accuracy = _pivot(rows, "eval_acc", "pairs")
    pairs = sorted({int(r["pairs"]) for r in rows})
    features = max(int(r["features"]) for r in rows)
    body = [[str(p)] + [_sig(accuracy[n].get(p)) for n in names] for p in pairs]
    return (f"## Associative retrieval ({_source(path, meta)})\n\nOne attention layer of "
            f"width {features} (a state of F = {features} features for the fixed-size "
            "memories) trained to recall the value of one of P stored keys (after Schlag et "
            "al. 2021; `linattn.model.retrieval`): the fraction of held-out answers read "
            "right. The figure: `figures/retrieval_capacity.png`."
            + _sentence(meta.get("caption")) + "\n\n"
            + _table(["pairs P"] + names, body))
