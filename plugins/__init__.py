"""mqstore's built-in plugins: ordinary plugin modules, registered like third-party ones."""
