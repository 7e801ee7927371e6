"""The run config: its schema (pydantic sections: base, algorithm, schema), loading (YAML, duplicate keys,
``--set``), presets, and resolution of each component spec against the plugin registry."""
