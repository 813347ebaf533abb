// Package manifest decodes multi-document YAML into unstructured objects.
package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Parse decodes a multi-document YAML (or JSON) stream, skipping empty
// documents.
func Parse(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" || string(t) == "{}" {
			continue
		}
		// Unstructured's own decoder keeps integers as int64, as the API
		// machinery everywhere else expects.
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
}
