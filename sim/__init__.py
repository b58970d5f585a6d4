"""cocotb benches and models of the QSC's peers (MAC, qubit, host), and the runner of
``qlink sim``. See ``docs/simulation.md``.
"""
