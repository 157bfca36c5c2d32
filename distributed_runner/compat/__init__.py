"""What users of MMEngine and iMIX bring: iMIX's hook names, MMEngine's utilities.

May import: core.
"""
