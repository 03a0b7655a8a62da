"""sim2real: export a trained actor (``export``), check it (``verify``), run it at a fixed rate
with safety limits (``deploy``), and measure its robustness to perturbed physics (``gap``)."""
