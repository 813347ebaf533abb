package v1alpha1

import (
	"context"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/yaml"
)

const crdPath = "../../../config/crds/capacitygrant.yaml"

func loadSchema(t *testing.T) *apiextensionsv1.JSONSchemaProps {
	t.Helper()
	b, err := os.ReadFile(crdPath)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatalf("%s: %v", crdPath, err)
	}
	if crd.Spec.Group != GroupName || crd.Spec.Names.Kind != "CapacityGrant" || crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
		t.Fatalf("CRD identity %s/%s/%s", crd.Spec.Group, crd.Spec.Names.Kind, crd.Spec.Scope)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != SchemeGroupVersion.Version || crd.Spec.Versions[0].Subresources == nil || crd.Spec.Versions[0].Subresources.Status == nil {
		t.Fatalf("want one version %s with the status subresource", SchemeGroupVersion.Version)
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema
}

// jsonFields lists the JSON field names of a struct type, following inline
// embedded structs the way encoding/json does.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name := strings.Split(tag, ",")[0]
		if name == "-" {
			continue
		}
		if f.Anonymous && (name == "" || strings.Contains(tag, "inline")) {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			for k, v := range jsonFields(ft) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// leafTypes are Go types whose schema is not an object with properties.
var leafTypes = map[reflect.Type]bool{
	reflect.TypeOf(resource.Quantity{}): true,
	reflect.TypeOf(metav1.Time{}):       true,
	reflect.TypeOf(apis.VolatileTime{}): true,
	reflect.TypeOf(metav1.ObjectMeta{}): true,
	reflect.TypeOf(metav1.TypeMeta{}):   true,
}

func compare(t *testing.T, path string, typ reflect.Type, s *apiextensionsv1.JSONSchemaProps) {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch {
	case leafTypes[typ]:
		return
	case typ.Kind() == reflect.Slice:
		if s.Type != "array" || s.Items == nil || s.Items.Schema == nil {
			t.Errorf("%s: Go has a slice, schema has type %q without items", path, s.Type)
			return
		}
		compare(t, path+"[]", typ.Elem(), s.Items.Schema)
		return
	case typ.Kind() == reflect.Map:
		if s.Type != "object" || s.AdditionalProperties == nil {
			t.Errorf("%s: Go has a map, schema needs type object with additionalProperties", path)
		}
		return
	case typ.Kind() != reflect.Struct:
		want := map[reflect.Kind]string{reflect.String: "string", reflect.Int32: "integer", reflect.Int64: "integer", reflect.Bool: "boolean"}[typ.Kind()]
		if want != "" && s.Type != want {
			t.Errorf("%s: Go %s, schema type %q (want %q)", path, typ.Kind(), s.Type, want)
		}
		return
	}
	goFields := jsonFields(typ)
	var missing, extra []string
	for name, ft := range goFields {
		ps, ok := s.Properties[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		compare(t, path+"."+name, ft, &ps)
	}
	for name := range s.Properties {
		if _, ok := goFields[name]; !ok {
			extra = append(extra, name)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("%s: Go fields missing from the CRD schema: %v (add them to %s)", path, missing, crdPath)
	}
	if len(extra) > 0 {
		t.Errorf("%s: schema properties with no Go field: %v", path, extra)
	}
}

func TestCRDSchemaMatchesGoTypes(t *testing.T) {
	compare(t, "CapacityGrant", reflect.TypeOf(CapacityGrant{}), loadSchema(t))
}

// validator runs the CRD's OpenAPI and CEL validation as the API server
// does at admission.
func validator(t *testing.T) func(obj map[string]any) []string {
	s := loadSchema(t)
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(s, internal, nil); err != nil {
		t.Fatal(err)
	}
	sv, _, err := validation.NewSchemaValidator(internal)
	if err != nil {
		t.Fatal(err)
	}
	structural, err := structuralschema.NewStructural(internal)
	if err != nil {
		t.Fatalf("schema is not structural: %v", err)
	}
	// The API server refuses a CRD whose schema breaks the structural
	// rules (e.g. types inside an int-or-string anyOf); NewStructural alone
	// does not check them.
	if errs := structuralschema.ValidateStructural(field.NewPath("schema"), structural); len(errs) > 0 {
		t.Fatalf("the API server would refuse this CRD: %v", errs.ToAggregate())
	}
	celv := cel.NewValidator(structural, true, celconfig.PerCallLimit)
	if celv == nil {
		t.Fatal("no CEL validator: the schema has x-kubernetes-validations, so one is expected")
	}
	return func(obj map[string]any) []string {
		var msgs []string
		for _, e := range validation.ValidateCustomResource(field.NewPath(""), obj, sv) {
			msgs = append(msgs, e.Error())
		}
		errs, _ := celv.Validate(context.Background(), field.NewPath(""), structural, obj, nil, celconfig.RuntimeCELCostBudget)
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}
		return msgs
	}
}

func validGrant() *CapacityGrant {
	d := "sha256:" + strings.Repeat("a", 64)
	return &CapacityGrant{
		TypeMeta:   metav1.TypeMeta{APIVersion: SchemeGroupVersion.String(), Kind: "CapacityGrant"},
		ObjectMeta: metav1.ObjectMeta{Name: "hello-00001", Namespace: "default"},
		Spec: CapacityGrantSpec{
			RevisionName: "hello-00001", Template: "localhost:5002/lampyr/templates@" + d, SnapshotArtifact: "localhost:5002/hello@" + d,
			MemoryPerFiber: resource.MustParse("128Mi"), MaxFibers: 10, MaxRequestSeconds: 300,
			Execution: ExecutionPolicy{Mode: ExecutionReuse, IdleTimeoutSeconds: 30, IdleAction: IdleActionRelease},
			Port:      8080, Protocol: "http1", Env: map[string]string{"K_REVISION": "hello-00001"},
		},
	}
}

func TestCRDRejectsMalformedGrants(t *testing.T) {
	validate := validator(t)
	toMap := func(g *CapacityGrant) map[string]any {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(g)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if errs := validate(toMap(validGrant())); len(errs) > 0 {
		t.Fatalf("a valid grant is rejected: %v", errs)
	}
	fresh := validGrant()
	fresh.Spec.Execution = ExecutionPolicy{Mode: ExecutionFresh}
	if errs := validate(toMap(fresh)); len(errs) > 0 {
		t.Fatalf("a valid fresh grant is rejected: %v", errs)
	}
	for _, tc := range []struct {
		name string
		mut  func(g *CapacityGrant, m map[string]any)
		want string
	}{
		{"template by tag", func(g *CapacityGrant, _ map[string]any) { g.Spec.Template = "localhost:5002/t:latest" }, "spec.template"},
		{"snapshot by tag", func(g *CapacityGrant, _ map[string]any) { g.Spec.SnapshotArtifact = "hello:v1" }, "spec.snapshotArtifact"},
		{"revision name not a DNS label", func(g *CapacityGrant, _ map[string]any) { g.Spec.RevisionName = "Hello_1" }, "spec.revisionName"},
		{"unknown mode", func(g *CapacityGrant, _ map[string]any) { g.Spec.Execution.Mode = "sometimes" }, "spec.execution.mode"},
		{"park/resume", func(g *CapacityGrant, _ map[string]any) { g.Spec.Execution.IdleAction = "park" }, "spec.execution.idleAction"},
		{"reuse without idle timeout", func(g *CapacityGrant, _ map[string]any) { g.Spec.Execution.IdleTimeoutSeconds = 0 }, "idleTimeoutSeconds is required"},
		{"fresh with idle timeout", func(g *CapacityGrant, _ map[string]any) { g.Spec.Execution.Mode = ExecutionFresh }, "apply only to mode reuse"},
		{"negative maxFibers", func(g *CapacityGrant, _ map[string]any) { g.Spec.MaxFibers = -1 }, "spec.maxFibers"},
		{"zero request lifetime", func(g *CapacityGrant, _ map[string]any) { g.Spec.MaxRequestSeconds = 0 }, "spec.maxRequestSeconds"},
		{"port out of range", func(g *CapacityGrant, _ map[string]any) { g.Spec.Port = 70000 }, "spec.port"},
		{"unknown protocol", func(g *CapacityGrant, _ map[string]any) { g.Spec.Protocol = "grpc" }, "spec.protocol"},
		{"memory not a quantity", func(_ *CapacityGrant, m map[string]any) {
			if m != nil {
				m["spec"].(map[string]any)["memoryPerFiber"] = "lots"
			}
		}, "spec.memoryPerFiber"},
		{"missing revisionName", func(_ *CapacityGrant, m map[string]any) {
			if m != nil {
				delete(m["spec"].(map[string]any), "revisionName")
			}
		}, "spec.revisionName"},
		{"maxFibers as a string", func(_ *CapacityGrant, m map[string]any) {
			if m != nil {
				m["spec"].(map[string]any)["maxFibers"] = "ten"
			}
		}, "spec.maxFibers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := validGrant()
			tc.mut(g, nil)
			m := toMap(g)
			tc.mut(g, m)
			errs := validate(m)
			if len(errs) == 0 {
				t.Fatalf("accepted; want a rejection naming %s", tc.want)
			}
			if !strings.Contains(strings.Join(errs, "\n"), tc.want) {
				t.Fatalf("errors %v do not name %q", errs, tc.want)
			}
		})
	}
}
