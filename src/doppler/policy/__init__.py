"""The learned method: DOPPLER's dual policy (SEL picks the next op, PLC its device), its rollouts,
features, checkpoints, and its registration as an assignment method."""

#: which heads of a policy are learned -> the method it makes; a head that is not learned follows
#: CRITICAL PATH's rule (SEL: largest b-level; PLC: earliest start): the paper's single-head ablations
LEARNED_HEADS = {"both": "doppler", "sel": "doppler_sel", "plc": "doppler_plc"}
#: the learned baselines: the paper's PLACETO and GDP, and the reviewers' single-policy ablation
BASELINE_METHODS = ("single_policy", "gdp", "placeto")
#: every learned method (each trains with ``doppler train --method NAME``)
LEARNED_METHODS = (*LEARNED_HEADS.values(), *BASELINE_METHODS)
#: the slope of every LeakyReLU of DOPPLER's networks (here, not in ``networks``: the torch-free decoder needs it)
LEAK = 0.01
