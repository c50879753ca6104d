package model

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Names are checked as the Kubernetes API (1.37) checks them on create, so
// that a directory of manifests gets the same rules as the API:
//
//   - a namespace is a DNS-1123 label (at most 63 characters);
//   - a Service name is a DNS-1123 label (1.37 made the old DNS-1035 rule,
//     a letter first, optional: RelaxedServiceNameValidation);
//   - a Service port name is a DNS-1123 label, unique in its Service, and
//     required when the Service has more than one port;
//   - an EndpointSlice name is a DNS-1123 subdomain (at most 253), and its
//     port names are DNS-1123 labels.
//
// Besides keeping nonsense out, this bounds every name the ruleset derives
// from them: the longest chain or set name fits the kernel's 255 bytes
// (nft's names_test.go checks the worst case).

// validateServiceNames reports the first invalid name of a Service, naming
// the field and the value.
func validateServiceNames(svc *corev1.Service, namespace string) error {
	errs := label(func() *field.Path { return field.NewPath("metadata", "namespace") }, namespace)
	errs = append(errs, label(func() *field.Path { return field.NewPath("metadata", "name") }, svc.Name)...)
	seen := make(map[string]bool, len(svc.Spec.Ports))
	for i, p := range svc.Spec.Ports {
		path := func() *field.Path { return field.NewPath("spec", "ports").Index(i).Child("name") }
		switch {
		case p.Name == "" && len(svc.Spec.Ports) > 1:
			errs = append(errs, field.Required(path(), "a Service with several ports names each"))
		case p.Name == "":
		case seen[p.Name]:
			errs = append(errs, field.Duplicate(path(), p.Name))
		default:
			seen[p.Name] = true
			errs = append(errs, label(path, p.Name)...)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("service %q: %v", namespace+"/"+svc.Name, errs[0])
}

// validateSliceNames reports the first invalid name of an EndpointSlice.
func validateSliceNames(sl *discoveryv1.EndpointSlice) error {
	var errs field.ErrorList
	if !isDNS1123Subdomain(sl.Name) {
		for _, msg := range validation.IsDNS1123Subdomain(sl.Name) {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), sl.Name, msg))
		}
	}
	for i, p := range sl.Ports {
		if p.Name != nil && *p.Name != "" {
			errs = append(errs, label(func() *field.Path { return field.NewPath("ports").Index(i).Child("name") }, *p.Name)...)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("endpointslice %q: %v", sl.Name, errs[0])
}

// label checks a DNS-1123 label; path is made only for an error.
func label(path func() *field.Path, value string) field.ErrorList {
	if isDNS1123Label(value) {
		return nil
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(value) {
		errs = append(errs, field.Invalid(path(), value, msg))
	}
	return errs
}

// isDNS1123Label tells whether validation.IsDNS1123Label finds nothing
// wrong with s: at most 63 characters, a label's. Its regular expression
// was a seventh of reading a hundred thousand Services' manifests, every
// name valid; the API's function still writes the errors of a name that
// is not.
func isDNS1123Label(s string) bool {
	return len(s) <= validation.DNS1123LabelMaxLength && labelChars(s)
}

// isDNS1123Subdomain tells whether validation.IsDNS1123Subdomain finds
// nothing wrong with s: at most 253 characters, labels (of any length)
// joined by dots.
func isDNS1123Subdomain(s string) bool {
	if len(s) > validation.DNS1123SubdomainMaxLength {
		return false
	}
	for part := range strings.SplitSeq(s, ".") {
		if !labelChars(part) {
			return false
		}
	}
	return true
}

// labelChars tells whether s is [a-z0-9]([-a-z0-9]*[a-z0-9])?.
func labelChars(s string) bool {
	if len(s) == 0 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
