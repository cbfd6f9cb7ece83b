package kube

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// objectName is the metadata the informers read of what they cache: the
// name and namespace their keys are made of, and the resource version that
// tells an update from a resync. It is a metav1.Object (meta.Accessor
// takes it) of 48 bytes, where an embedded metav1.ObjectMeta was 232 in
// every cached Service and EndpointSlice, with the rest left empty (issue
// 16's memory budget: about 400 bytes a Service at 10k). The other
// metadata is not kept: it reads as empty, and setting it is dropped.
type objectName struct {
	Name, Namespace, ResourceVersion string
}

var _ metav1.Object = (*objectName)(nil)

// nameOf is m's objectName, with name for m.Name: the copy the cached
// object keeps besides. Neither it nor the resource version is the decoded
// object's own string, and the namespace is the trim's interned one: one
// string kept of an object decoded from a list keeps the span it was
// decoded into, and with it the room of every string of the list
// decoded beside it (BenchmarkInitialListHeapInUse).
func nameOf(m *metav1.ObjectMeta, name string) objectName {
	return objectName{Name: name, Namespace: m.Namespace, ResourceVersion: strings.Clone(m.ResourceVersion)}
}

func (o *objectName) GetNamespace() string                  { return o.Namespace }
func (o *objectName) SetNamespace(namespace string)         { o.Namespace = namespace }
func (o *objectName) GetName() string                       { return o.Name }
func (o *objectName) SetName(name string)                   { o.Name = name }
func (o *objectName) GetResourceVersion() string            { return o.ResourceVersion }
func (o *objectName) SetResourceVersion(version string)     { o.ResourceVersion = version }
func (o *objectName) GetGenerateName() string               { return "" }
func (o *objectName) SetGenerateName(string)                {}
func (o *objectName) GetUID() types.UID                     { return "" }
func (o *objectName) SetUID(types.UID)                      {}
func (o *objectName) GetGeneration() int64                  { return 0 }
func (o *objectName) SetGeneration(int64)                   {}
func (o *objectName) GetSelfLink() string                   { return "" }
func (o *objectName) SetSelfLink(string)                    {}
func (o *objectName) GetCreationTimestamp() metav1.Time     { return metav1.Time{} }
func (o *objectName) SetCreationTimestamp(metav1.Time)      {}
func (o *objectName) GetDeletionTimestamp() *metav1.Time    { return nil }
func (o *objectName) SetDeletionTimestamp(*metav1.Time)     {}
func (o *objectName) GetDeletionGracePeriodSeconds() *int64 { return nil }
func (o *objectName) SetDeletionGracePeriodSeconds(*int64)  {}
func (o *objectName) GetLabels() map[string]string          { return nil }
func (o *objectName) SetLabels(map[string]string)           {}
func (o *objectName) GetAnnotations() map[string]string     { return nil }
func (o *objectName) SetAnnotations(map[string]string)      {}
func (o *objectName) GetFinalizers() []string               { return nil }
func (o *objectName) SetFinalizers([]string)                {}
func (o *objectName) GetOwnerReferences() []metav1.OwnerReference {
	return nil
}
func (o *objectName) SetOwnerReferences([]metav1.OwnerReference) {}
func (o *objectName) GetManagedFields() []metav1.ManagedFieldsEntry {
	return nil
}
func (o *objectName) SetManagedFields([]metav1.ManagedFieldsEntry) {}
