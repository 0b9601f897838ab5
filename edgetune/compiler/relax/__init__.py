"""The Relax graph rewrites of edgetune's compiler: the layout conversion and integer
arithmetic applied when a model is imported, and the rewrites of the `prepare` pipeline before
fusion (Winograd's convolutions, channel padding, constants folded with NumPy, fast math
legalization). `graph` holds what they share."""
