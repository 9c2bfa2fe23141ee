"""The script library: named, versioned, immutable code with input and output schemas
(schemas, store), promoted draft → proven on evidence and invoked by name (service)."""
