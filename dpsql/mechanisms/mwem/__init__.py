"""MWEM (Hardt, Ligett & McSherry 2012) and its variants: the algorithm, its options and its state."""
