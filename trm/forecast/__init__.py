"""Multi-slice forecasts from compiled TPU programs (`trm.aot --forecast`).

hlo.py reads the compiled text; ops.py costs one instruction; loops.py reads
trip counts; network.py places collectives on the torus and the DCN;
timeline.py plays the schedule; plan.py makes the rows; search.py ranks mesh
layouts.
"""
