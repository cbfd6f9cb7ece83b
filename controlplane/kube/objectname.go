package kube

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// cachedMeta is the metadata of what the informers cache: the resource
// version (what tells an update from a resync); the rest reads as empty,
// and setting it is dropped. Each cached type adds its name and namespace
// (what its keys are made of) from the parsed form it holds, which makes
// it a metav1.Object that meta.Accessor takes, of a few words where an
// embedded metav1.ObjectMeta was 232 bytes in every cached Service and
// EndpointSlice (issue 16's memory budget).
type cachedMeta struct {
	resourceVersion string
}

var (
	_ metav1.Object = (*cachedService)(nil)
	_ metav1.Object = (*cachedSlice)(nil)
)

func (c *cachedService) GetNamespace() string          { return c.Namespace }
func (c *cachedService) SetNamespace(namespace string) { c.Namespace = namespace }
func (c *cachedService) GetName() string               { return c.Name }
func (c *cachedService) SetName(name string)           { c.Name = name }
func (c *cachedSlice) GetNamespace() string            { return c.Namespace }
func (c *cachedSlice) SetNamespace(namespace string)   { c.Namespace = namespace }
func (c *cachedSlice) GetName() string                 { return c.Name }
func (c *cachedSlice) SetName(name string)             { c.Name = name }

func (c *cachedMeta) GetResourceVersion() string        { return c.resourceVersion }
func (c *cachedMeta) SetResourceVersion(version string) { c.resourceVersion = version }

// metaOf is what the cache keeps of m: its resource version, copied: not the decoded
// object's own string, since one string kept of an object decoded from a
// list keeps the span it was decoded into, and with it the room of every
// string of the list decoded beside it (BenchmarkInitialListHeapInUse).
func metaOf(m *metav1.ObjectMeta) cachedMeta {
	return cachedMeta{resourceVersion: strings.Clone(m.ResourceVersion)}
}

func (*cachedMeta) GetGenerateName() string               { return "" }
func (*cachedMeta) SetGenerateName(string)                {}
func (*cachedMeta) GetUID() types.UID                     { return "" }
func (*cachedMeta) SetUID(types.UID)                      {}
func (*cachedMeta) GetGeneration() int64                  { return 0 }
func (*cachedMeta) SetGeneration(int64)                   {}
func (*cachedMeta) GetSelfLink() string                   { return "" }
func (*cachedMeta) SetSelfLink(string)                    {}
func (*cachedMeta) GetCreationTimestamp() metav1.Time     { return metav1.Time{} }
func (*cachedMeta) SetCreationTimestamp(metav1.Time)      {}
func (*cachedMeta) GetDeletionTimestamp() *metav1.Time    { return nil }
func (*cachedMeta) SetDeletionTimestamp(*metav1.Time)     {}
func (*cachedMeta) GetDeletionGracePeriodSeconds() *int64 { return nil }
func (*cachedMeta) SetDeletionGracePeriodSeconds(*int64)  {}
func (*cachedMeta) GetLabels() map[string]string          { return nil }
func (*cachedMeta) SetLabels(map[string]string)           {}
func (*cachedMeta) GetAnnotations() map[string]string     { return nil }
func (*cachedMeta) SetAnnotations(map[string]string)      {}
func (*cachedMeta) GetFinalizers() []string               { return nil }
func (*cachedMeta) SetFinalizers([]string)                {}
func (*cachedMeta) GetOwnerReferences() []metav1.OwnerReference {
	return nil
}
func (*cachedMeta) SetOwnerReferences([]metav1.OwnerReference) {}
func (*cachedMeta) GetManagedFields() []metav1.ManagedFieldsEntry {
	return nil
}
func (*cachedMeta) SetManagedFields([]metav1.ManagedFieldsEntry) {}
