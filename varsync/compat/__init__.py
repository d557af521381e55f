"""Drop-in replacements for the classes varsync grew out of."""
