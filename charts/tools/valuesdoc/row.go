package main

// Row is one documented value.
type Row struct {
	// Key is the dotted path, e.g. "image.tag".
	Key string
	// Type is the YAML type of the default: string, int, float, bool, list or map.
	Type string
	// Default is the default rendered as compact JSON.
	Default string
	// Description is the "# --" comment, joined into one line.
	Description string
}
