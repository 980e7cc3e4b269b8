"""A store's life: opening, recovery and what a store records about itself."""
