"""The learned method: DOPPLER's dual policy (SEL picks the next op, PLC its device), its rollouts,
features, checkpoints, and its registration as an assignment method."""

#: which heads of a policy are learned -> the method it makes; a head that is not learned follows
#: CRITICAL PATH's rule (SEL: largest b-level; PLC: earliest start): the paper's single-head ablations
LEARNED_HEADS = {"both": "doppler", "sel": "doppler_sel", "plc": "doppler_plc"}
