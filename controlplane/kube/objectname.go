package kube

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// metaStubs is the metadata of what the informers cache that is not kept:
// it reads as empty, and setting it is dropped. Each cached type adds its
// name, namespace and resource version (the names its keys are made of,
// and what tells an update from a resync), which makes it a metav1.Object
// that meta.Accessor takes, of a few words where an embedded
// metav1.ObjectMeta was 232 bytes in every cached Service and
// EndpointSlice (issue 16's memory budget). It takes no room.
type metaStubs struct{}

var (
	_ metav1.Object = (*cachedService)(nil)
	_ metav1.Object = (*cachedSlice)(nil)
)

func (c *cachedService) GetNamespace() string            { return c.Namespace }
func (c *cachedService) SetNamespace(namespace string)   { c.Namespace = namespace }
func (c *cachedService) GetName() string                 { return c.Name }
func (c *cachedService) SetName(name string)             { c.Name = name }
func (c *cachedService) GetResourceVersion() string      { return c.resourceVersion }
func (c *cachedService) SetResourceVersion(v string)     { c.resourceVersion = v }
func (c *cachedSlice) GetNamespace() string              { return c.Namespace }
func (c *cachedSlice) SetNamespace(namespace string)     { c.Namespace = namespace }
func (c *cachedSlice) GetName() string                   { return c.Name }
func (c *cachedSlice) SetName(name string)               { c.Name = name }
func (c *cachedSlice) GetResourceVersion() string        { return c.resourceVersion }
func (c *cachedSlice) SetResourceVersion(version string) { c.resourceVersion = version }

// resourceVersion is m's resource version, copied: not the decoded
// object's own string, since one string kept of an object decoded from a
// list keeps the span it was decoded into, and with it the room of every
// string of the list decoded beside it (BenchmarkInitialListHeapInUse).
func resourceVersion(m *metav1.ObjectMeta) string { return strings.Clone(m.ResourceVersion) }

func (metaStubs) GetGenerateName() string               { return "" }
func (metaStubs) SetGenerateName(string)                {}
func (metaStubs) GetUID() types.UID                     { return "" }
func (metaStubs) SetUID(types.UID)                      {}
func (metaStubs) GetGeneration() int64                  { return 0 }
func (metaStubs) SetGeneration(int64)                   {}
func (metaStubs) GetSelfLink() string                   { return "" }
func (metaStubs) SetSelfLink(string)                    {}
func (metaStubs) GetCreationTimestamp() metav1.Time     { return metav1.Time{} }
func (metaStubs) SetCreationTimestamp(metav1.Time)      {}
func (metaStubs) GetDeletionTimestamp() *metav1.Time    { return nil }
func (metaStubs) SetDeletionTimestamp(*metav1.Time)     {}
func (metaStubs) GetDeletionGracePeriodSeconds() *int64 { return nil }
func (metaStubs) SetDeletionGracePeriodSeconds(*int64)  {}
func (metaStubs) GetLabels() map[string]string          { return nil }
func (metaStubs) SetLabels(map[string]string)           {}
func (metaStubs) GetAnnotations() map[string]string     { return nil }
func (metaStubs) SetAnnotations(map[string]string)      {}
func (metaStubs) GetFinalizers() []string               { return nil }
func (metaStubs) SetFinalizers([]string)                {}
func (metaStubs) GetOwnerReferences() []metav1.OwnerReference {
	return nil
}
func (metaStubs) SetOwnerReferences([]metav1.OwnerReference) {}
func (metaStubs) GetManagedFields() []metav1.ManagedFieldsEntry {
	return nil
}
func (metaStubs) SetManagedFields([]metav1.ManagedFieldsEntry) {}
